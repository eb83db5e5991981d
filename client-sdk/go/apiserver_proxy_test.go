// A proxy in front of the test control plane's apiserver that delays the bytes of watch responses and
// nothing else, so a write's answer reaches a daemon before the write's watch event does: the window in
// which a daemon could hand out state older than a write it has already answered.

package consistd_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// watchDelayProxy serves the apiserver's API over TLS of its own; Kubeconfig reaches the apiserver through
// it with the control plane's admin credentials.
type watchDelayProxy struct {
	Kubeconfig string
}

// startWatchDelayProxy starts a proxy that holds every chunk of a watch response for delay (in order)
// and passes everything else at once; it stops when the test ends.
func startWatchDelayProxy(t *testing.T, delay time.Duration) *watchDelayProxy {
	t.Helper()
	source, err := os.ReadFile(env(t, "CONSISTD_TEST_KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		for line := range strings.Lines(string(source)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+": "); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("no %s in the kubeconfig", name)
		return ""
	}
	decoded := func(name string) []byte {
		b, err := base64.StdEncoding.DecodeString(field(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return b
	}
	upstream, err := url.Parse(field("server"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(decoded("certificate-authority-data")) {
		t.Fatal("no CA certificate in the kubeconfig")
	}
	admin, err := tls.X509KeyPair(decoded("client-certificate-data"), decoded("client-key-data"))
	if err != nil {
		t.Fatalf("the kubeconfig's client certificate: %v", err)
	}
	transport := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{admin}},
		ForceAttemptHTTP2: true,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(upstream) },
		Transport:     transport,
		FlushInterval: -1, // stream each chunk as it is released
		ModifyResponse: func(r *http.Response) error {
			if w := r.Request.URL.Query().Get("watch"); w == "true" || w == "1" {
				r.Body = delayed(r.Body, delay)
			}
			return nil
		},
	}

	ca, leaf := testCertificates(t)
	server := httptest.NewUnstartedServer(proxy)
	server.EnableHTTP2 = true
	server.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	server.StartTLS()
	t.Cleanup(func() {
		server.CloseClientConnections()
		server.Close()
		transport.CloseIdleConnections()
	})

	// The same kubeconfig but for the server and the CA that signed the proxy's certificate.
	var out strings.Builder
	for line := range strings.Lines(string(source)) {
		trimmed := strings.TrimSpace(line)
		indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
		switch {
		case strings.HasPrefix(trimmed, "server: "):
			line = indent + "server: " + server.URL + "\n"
		case strings.HasPrefix(trimmed, "certificate-authority-data: "):
			line = indent + "certificate-authority-data: " + base64.StdEncoding.EncodeToString(ca) + "\n"
		}
		out.WriteString(line)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(out.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return &watchDelayProxy{Kubeconfig: kubeconfig}
}

// delayed hands out body's bytes delay after they were read from it, in order.
func delayed(body io.ReadCloser, delay time.Duration) io.ReadCloser {
	type chunk struct {
		release time.Time
		data    []byte
		err     error
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32*1024)
			n, err := body.Read(buf)
			chunks <- chunk{release: time.Now().Add(delay), data: buf[:n], err: err}
			if err != nil {
				return
			}
		}
	}()
	r, w := io.Pipe()
	go func() {
		for c := range chunks {
			time.Sleep(time.Until(c.release))
			if len(c.data) > 0 {
				if _, err := w.Write(c.data); err != nil {
					body.Close()
					return
				}
			}
			if c.err != nil {
				w.CloseWithError(c.err)
				return
			}
		}
	}()
	return &delayedBody{PipeReader: r, body: body}
}

type delayedBody struct {
	*io.PipeReader
	body io.ReadCloser
}

func (d *delayedBody) Close() error {
	d.PipeReader.Close()
	return d.body.Close()
}

// testCertificates makes a CA (its PEM) and a serving certificate for 127.0.0.1 signed by it.
func testCertificates(t *testing.T) (caPEM []byte, leaf tls.Certificate) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey, leafKey := key(), key()
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "consistd go sdk test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTemplate, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}
}
