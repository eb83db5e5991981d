// Test helpers: clients of the harness's daemons, fresh namespaces, watches read with a timeout, and a
// daemon's metrics.

package consistd_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// waitFor bounds every wait for an event or state in these tests.
const waitFor = 30 * time.Second

// env returns an environment variable hack/with-daemons.sh sets, failing the test without it.
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run under hack/with-control-plane.sh hack/with-daemons.sh hack/sdk/go.sh test", name)
	}
	return v
}

// testContext is cancelled when the test ends.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// ready returns a client for socket (daemon a's, CONSISTD_SOCKET, when empty), ready, closed when the
// test ends.
func ready(t *testing.T, socket string) *consistd.Client {
	t.Helper()
	if socket == "" {
		socket = env(t, "CONSISTD_SOCKET")
	}
	c, err := consistd.New(consistd.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.WaitReady(testContext(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// unique gives a name no other test run uses.
func unique(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// freshNamespace creates a namespace for one test through c and deletes it when the test ends.
func freshNamespace(t *testing.T, c *consistd.Client) string {
	t.Helper()
	ns := unique("go-sdk")
	obj := map[string]any{"metadata": map[string]any{"name": ns}}
	if _, err := c.Create(testContext(t), "namespaces", "", obj); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Delete(ctx, "namespaces", "", ns)
	})
	return ns
}

// testLabel marks the ConfigMaps the tests create, so watches see only those.
const testLabel = "sdk.consistd.io/test=go"

// configMap is a labelled ConfigMap with the given data.
func configMap(name string, data map[string]string) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": name, "labels": map[string]string{"sdk.consistd.io/test": "go"}},
		"data":     data,
	}
}

// mustCreate creates a labelled ConfigMap through c.
func mustCreate(t *testing.T, c *consistd.Client, ns, name string) *consistd.Object {
	t.Helper()
	obj, err := c.Create(testContext(t), "configmaps", ns, configMap(name, map[string]string{"k": "v"}))
	if err != nil {
		t.Fatalf("creating configmap %s/%s: %v", ns, name, err)
	}
	return obj
}

// watching is a watch running in the background whose events a test reads with a timeout.
type watching struct {
	t      *testing.T
	events chan watched
	stop   context.CancelFunc
}

type watched struct {
	event consistd.Event
	err   error
}

// watch starts c.Watch(req) until the test ends (or stop is called).
func watch(t *testing.T, c *consistd.Client, req consistd.WatchRequest) *watching {
	ctx, stop := context.WithCancel(testContext(t))
	w := &watching{t: t, events: make(chan watched, 1024), stop: stop}
	go func() {
		defer close(w.events)
		for ev, err := range c.Watch(ctx, req) {
			select {
			case w.events <- watched{ev, err}:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(stop)
	return w
}

// next is the watch's next event; the test fails on an error, the end of the watch or a timeout.
func (w *watching) next() consistd.Event {
	w.t.Helper()
	select {
	case r, ok := <-w.events:
		if !ok {
			w.t.Fatal("the watch ended")
		}
		if r.err != nil {
			w.t.Fatalf("the watch failed: %v", r.err)
		}
		return r.event
	case <-time.After(waitFor):
		w.t.Fatalf("no watch event within %s", waitFor)
	}
	panic("unreachable")
}

// quiet fails the test if an event arrives within d.
func (w *watching) quiet(d time.Duration) {
	w.t.Helper()
	select {
	case r := <-w.events:
		w.t.Fatalf("unexpected watch event %s %s (error %v)", r.event.Type, describe(r.event), r.err)
	case <-time.After(d):
	}
}

// describe names an event's object: "name@resourceVersion", or "-" for markers.
func describe(ev consistd.Event) string {
	if ev.Object == nil {
		return "-"
	}
	return ev.Object.Name + "@" + ev.Object.ResourceVersion
}

// initialState reads a snapshot: Added events up to Synced; returns the names seen.
func (w *watching) initialState() map[string]bool {
	w.t.Helper()
	names := map[string]bool{}
	for {
		ev := w.next()
		switch ev.Type {
		case consistd.Synced:
			return names
		case consistd.Added:
			if names[ev.Object.Name] {
				w.t.Fatalf("%s added twice in one snapshot", ev.Object.Name)
			}
			names[ev.Object.Name] = true
		default:
			w.t.Fatalf("unexpected %s %s in the initial state", ev.Type, describe(ev))
		}
	}
}

// nextState reads a channel of leadership states until one satisfies ok, failing on an error, the
// channel's end or a timeout.
func nextState(t *testing.T, states <-chan consistd.Leadership, what string, ok func(consistd.Leadership) bool) consistd.Leadership {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case s, open := <-states:
			if !open {
				t.Fatalf("the leadership channel closed while waiting for %s", what)
			}
			if s.Err != nil {
				t.Fatalf("leadership failed while waiting for %s: %v", what, s.Err)
			}
			t.Logf("leadership: %s holder=%q term=%d", s.State, s.Holder, s.Term)
			if ok(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("no %s within %s", what, waitFor)
		}
	}
}

// metrics is a daemon's Prometheus exposition, from GET /metrics on its admin socket (HTTP/1.0: the
// response ends with the connection).
func metrics(t *testing.T, admin string) string {
	t.Helper()
	conn, err := net.DialTimeout("unix", admin, 5*time.Second)
	if err != nil {
		t.Fatalf("connecting to admin socket %s: %v", admin, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: consistd\r\n\r\n"); err != nil {
		t.Fatalf("asking %s for /metrics: %v", admin, err)
	}
	response, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatalf("reading /metrics from %s: %v", admin, err)
	}
	head, body, ok := strings.Cut(string(response), "\r\n\r\n")
	if !ok || !(strings.HasPrefix(head, "HTTP/1.0 200") || strings.HasPrefix(head, "HTTP/1.1 200")) {
		t.Fatalf("/metrics on %s answered %q", admin, head)
	}
	return body
}

// callsStarted is how many calls of service's method the daemon behind admin started, from its
// consistd_grpc_server_started_total (summed over the series of that method; the daemon creates every
// method's series at 0, so a missing one fails the test).
func callsStarted(t *testing.T, admin, service, method string) float64 {
	t.Helper()
	exposition := metrics(t, admin)
	labels := []string{fmt.Sprintf("grpc_service=%q", service), fmt.Sprintf("grpc_method=%q", method)}
	total, found := 0.0, false
	for line := range strings.Lines(exposition) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), "} ")
		if !ok || !strings.HasPrefix(series, "consistd_grpc_server_started_total{") ||
			!strings.Contains(series, labels[0]) || !strings.Contains(series, labels[1]) {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			t.Fatalf("started calls of %s/%s: %q: %v", service, method, line, err)
		}
		total, found = total+v, true
	}
	if !found {
		t.Fatalf("no consistd_grpc_server_started_total of %s/%s in the metrics of %s:\n%s", service, method, admin, exposition)
	}
	return total
}
