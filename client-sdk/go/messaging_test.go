// Tests of sends to a peer and the inbox handler that ACKs or NACKs them.

package consistd_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// serveInbox runs handler on the peer daemon's inbox until the test ends (and waits for Serve to return
// then, so the next test's handler is the only receiver).
func serveInbox(t *testing.T, handler consistd.Handler) {
	b := ready(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	inbox := b.Inbox()
	inbox.RetryAfter = 100 * time.Millisecond
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- inbox.Serve(ctx, handler) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// send sends one message about resource to the peer daemon through daemon a.
func send(t *testing.T, a *consistd.Client, resource, event, payload string) *consistd.Sent {
	t.Helper()
	sent, err := a.Send(testContext(t), consistd.SendRequest{
		To:         consistd.ToPeer(env(t, "CONSISTD_TEST_PEER_ADDRESS")),
		ResourceID: resource, EventID: event, Payload: []byte(payload), ContentType: "text/plain",
	})
	if err != nil {
		t.Fatal(err)
	}
	if sent.MessageID == "" {
		t.Fatal("Send returned no message id")
	}
	return sent
}

// waitOutcome awaits a send's outcome with a timeout.
func waitOutcome(t *testing.T, sent *consistd.Sent) consistd.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), waitFor)
	defer cancel()
	o, err := sent.Wait(ctx)
	if err != nil {
		t.Fatalf("outcome of %s: %v", sent.MessageID, err)
	}
	return o
}

func TestSendToAPeerIsAckedWhenItsInboxHandlerReturns(t *testing.T) {
	a := ready(t, "")
	resource := unique("go-send")
	received := make(chan *consistd.Message, 16)
	serveInbox(t, func(_ context.Context, m *consistd.Message) error {
		if m.ResourceID == resource {
			received <- m
		}
		return nil
	})

	sent := send(t, a, resource, "1", "hello")
	if o := waitOutcome(t, sent); o.Kind != consistd.Acked || !o.IsAcked() || o.Peer == "" {
		t.Fatalf("outcome %s from peer %q (reason %q), want ACKED from the peer", o.Kind, o.Peer, o.Reason)
	}
	m := <-received
	if m.EventID != "1" || string(m.Payload) != "hello" || m.ContentType != "text/plain" || m.Sender != "sdk-a" || m.DeliveryAttempt != 1 {
		t.Fatalf("received %+v, want event 1 \"hello\" text/plain from sdk-a, first attempt", m)
	}

	// Outcomes of further sends on the same client are matched to their own message.
	second, third := send(t, a, resource+"-b", "1", "x"), send(t, a, resource+"-c", "1", "y")
	if waitOutcome(t, third).Kind != consistd.Acked || waitOutcome(t, second).Kind != consistd.Acked {
		t.Fatal("later sends were not ACKED")
	}
}

func TestAHandlerErrorNacksTheMessageWhichComesAgainThenIsAcked(t *testing.T) {
	a := ready(t, "")
	resource := unique("go-nack")
	var mu sync.Mutex
	var attempts []uint32
	serveInbox(t, func(_ context.Context, m *consistd.Message) error {
		if m.ResourceID != resource {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, m.DeliveryAttempt)
		if len(attempts) == 1 {
			return consistd.Retry(errors.New("not ready for it yet"), 200*time.Millisecond)
		}
		return nil
	})

	start := time.Now()
	if o := waitOutcome(t, send(t, a, resource, "1", "again")); o.Kind != consistd.Acked {
		t.Fatalf("outcome %s (reason %q), want ACKED after the redelivery", o.Kind, o.Reason)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(attempts, []uint32{1, 2}) {
		t.Fatalf("delivery attempts %v, want [1 2]", attempts)
	}
	if elapsed := time.Since(start); elapsed < 200*time.Millisecond {
		t.Fatalf("redelivered after %s, before the 200ms the handler asked for", elapsed)
	}
}
