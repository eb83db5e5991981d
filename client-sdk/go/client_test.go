// Tests of connecting, waiting for readiness and the errors the daemon answers.

package consistd_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func TestNewWithNoArgumentsUsesCONSISTD_SOCKETAndWaitsReady(t *testing.T) {
	socket := env(t, "CONSISTD_SOCKET")
	c, err := consistd.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Socket() != socket {
		t.Fatalf("socket %q, want CONSISTD_SOCKET %q", c.Socket(), socket)
	}
	if err := c.WaitReady(testContext(t), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestNewWithoutCONSISTD_SOCKETUsesTheDefaultSocket(t *testing.T) {
	t.Setenv("CONSISTD_SOCKET", "")
	c, err := consistd.New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Socket() != consistd.DefaultSocket {
		t.Fatalf("socket %q, want %q", c.Socket(), consistd.DefaultSocket)
	}
}

func TestWaitReadyOnAMissingSocketFailsAfterTheTimeoutNamingTheSocket(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "missing.sock")
	c, err := consistd.New(consistd.WithSocket(socket))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	err = c.WaitReady(testContext(t), 700*time.Millisecond)
	elapsed := time.Since(start)
	var notReady *consistd.NotReadyError
	if !errors.As(err, &notReady) {
		t.Fatalf("error %v (%T), want a *NotReadyError", err, err)
	}
	if elapsed < 700*time.Millisecond || elapsed > 5*time.Second {
		t.Fatalf("gave up after %s, want the 700ms timeout", elapsed)
	}
	if !strings.Contains(err.Error(), socket) || !strings.Contains(err.Error(), "not ready within 700ms") {
		t.Fatalf("error %q names neither the socket nor the timeout", err)
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("last health check's code %s, want Unavailable (error %q)", status.Code(err), err)
	}
}

func TestErrorsKeepTheDaemonsCodeAndMessage(t *testing.T) {
	c := ready(t, "")
	ctx := testContext(t)
	for _, err := range c.Watch(ctx, consistd.WatchRequest{Resource: ""}) {
		if err == nil {
			t.Fatal("a watch of no resource delivered an event")
		}
		s, ok := status.FromError(err)
		if !ok || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), "resource") {
			t.Fatalf("watch error %v, want INVALID_ARGUMENT starting with \"resource\"", err)
		}
	}
	_, err := c.Get(ctx, "configmaps", "default", unique("missing"))
	if status.Code(err) != codes.NotFound {
		t.Fatalf("get of a missing object: %v, want NOT_FOUND", err)
	}
	_, err = c.Patch(ctx, "configmaps", "default", "x", consistd.MergePatch, []byte(`{}`),
		consistd.WithGuard(consistd.Guard{Election: unique("not-led"), Term: 1}))
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a write guarded by an election this daemon does not lead: %v, want FAILED_PRECONDITION", err)
	}
}
