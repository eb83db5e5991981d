// Tests of the streams sends and ACKs share: one SendStream and one AckStream per client however many
// calls, a refused send failing alone, and a new stream after the connection to the sidecar is lost.

package consistd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

const (
	outboxService = "consistd.v1.OutboxService"
	inboxService  = "consistd.v1.InboxService"
)

func TestConcurrentSendsAndAcksGoOutOnOneStreamEachAndARefusedSendFailsAlone(t *testing.T) {
	adminA, adminB := env(t, "CONSISTD_TEST_ADMIN_SOCKET"), env(t, "CONSISTD_TEST_PEER_ADMIN_SOCKET")
	started := func() [4]float64 {
		return [4]float64{
			callsStarted(t, adminA, outboxService, "SendStream"), callsStarted(t, adminA, outboxService, "Send"),
			callsStarted(t, adminB, inboxService, "AckStream"), callsStarted(t, adminB, inboxService, "Ack"),
		}
	}
	before := started()

	a := ready(t, "")
	serveInbox(t, func(context.Context, *consistd.Message) error { return nil })
	prefix := unique("go-stream")
	const sends, refused = 200, 100
	results := make([]*consistd.Sent, sends)
	errs := make([]error, sends)
	var wg sync.WaitGroup
	for i := range sends {
		resource := fmt.Sprintf("%s-%d", prefix, i)
		if i == refused {
			resource = ""
		}
		wg.Go(func() {
			results[i], errs[i] = a.Send(testContext(t), consistd.SendRequest{
				To:         consistd.ToPeer(env(t, "CONSISTD_TEST_PEER_ADDRESS")),
				ResourceID: resource, EventID: "1", Payload: []byte("x"), ContentType: "text/plain",
			})
		})
	}
	wg.Wait()

	for i, err := range errs {
		if i == refused {
			if s := status.Convert(err); err == nil || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), "resource_id") {
				t.Fatalf("the send without a resource id: %v, want INVALID_ARGUMENT naming resource_id", err)
			}
		} else if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	for i, sent := range results {
		if i == refused {
			continue
		}
		if o := waitOutcome(t, sent); !o.IsAcked() {
			t.Fatalf("send %d: outcome %s (reason %q), want ACKED", i, o.Kind, o.Reason)
		}
	}

	after := started()
	for i, want := range [4]float64{1, 0, 1, 0} {
		name := [4]string{"SendStream on a", "Send on a", "AckStream on b", "Ack on b"}[i]
		if got := after[i] - before[i]; got != want {
			t.Errorf("%s started %v times, want %v", name, got, want)
		}
	}
}

func TestASendWaitingWhenTheSidecarIsLostFailsAsUnavailableAndTheNextOpensANewStream(t *testing.T) {
	d := startDaemon(t, "sdk-go-stream", "peer:", "  insecure: true")
	c := ready(t, d.Socket)
	message := func(event string) consistd.SendRequest {
		return consistd.SendRequest{
			To:         consistd.ToPeer(env(t, "CONSISTD_TEST_PEER_ADDRESS")),
			ResourceID: "go-reopen", EventID: event, Payload: []byte(event), ContentType: "text/plain",
		}
	}
	if _, err := c.Send(testContext(t), message("1")); err != nil {
		t.Fatalf("first send: %v", err)
	}

	// The sidecar stops answering with a send waiting on the stream, then dies.
	d.pause()
	lost := make(chan error, 1)
	go func() {
		_, err := c.Send(testContext(t), message("2"))
		lost <- err
	}()
	select {
	case err := <-lost:
		t.Fatalf("a paused sidecar answered a send: %v (its process: %s)", err, d.state())
	case <-time.After(300 * time.Millisecond):
	}
	d.kill()
	select {
	case err := <-lost:
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "lost the connection to the sidecar") {
			t.Fatalf("the send waiting when the sidecar died: %v, want UNAVAILABLE, lost the connection", err)
		}
		t.Logf("the send waiting when the sidecar died: %v", err)
	case <-time.After(waitFor):
		t.Fatalf("the send waiting when the sidecar died did not return within %s", waitFor)
	}

	d.start()
	if err := c.WaitReady(testContext(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(testContext(t), message("3")); err != nil {
		t.Fatalf("the send after the restart: %v", err)
	}
	if n := callsStarted(t, d.Admin, outboxService, "SendStream"); n != 1 {
		t.Fatalf("the restarted sidecar started %v SendStream calls, want 1", n)
	}
	if n := callsStarted(t, d.Admin, outboxService, "Send"); n != 0 {
		t.Fatalf("the restarted sidecar started %v unary Send calls, want 0", n)
	}
}

func TestSendsAndAcksOpenTheirStreamAgainAfterTheConnectionIsCut(t *testing.T) {
	adminA, adminB := env(t, "CONSISTD_TEST_ADMIN_SOCKET"), env(t, "CONSISTD_TEST_PEER_ADMIN_SOCKET")
	sendsBefore, acksBefore := callsStarted(t, adminA, outboxService, "SendStream"), callsStarted(t, adminB, inboxService, "AckStream")
	toA, toB := startProxy(t, env(t, "CONSISTD_SOCKET")), startProxy(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	a := ready(t, toA.Socket)
	b := ready(t, toB.Socket)
	resource := unique("go-cut")
	received := make(chan string, 16)
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	inbox := b.Inbox()
	inbox.RetryAfter = 100 * time.Millisecond
	go func() {
		served <- inbox.Serve(ctx, func(_ context.Context, m *consistd.Message) error {
			if m.ResourceID == resource {
				received <- m.EventID
			}
			return nil
		})
	}()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	const rounds = 3
	for round := range rounds {
		event := fmt.Sprint(round)
		sent := send(t, a, resource, event, "again")
		if o := waitOutcome(t, sent); !o.IsAcked() {
			t.Fatalf("round %d: outcome %s (reason %q), want ACKED", round, o.Kind, o.Reason)
		}
		if got := <-received; got != event {
			t.Fatalf("round %d: received event %s", round, got)
		}
		// Every connection of both apps is cut: the next send and ACK open their streams again.
		toA.cut()
		toB.cut()
		time.Sleep(200 * time.Millisecond)
	}
	if n := callsStarted(t, adminA, outboxService, "SendStream") - sendsBefore; n != rounds {
		t.Errorf("%v SendStream calls started, want one per connection (%d)", n, rounds)
	}
	if n := callsStarted(t, adminB, inboxService, "AckStream") - acksBefore; n != rounds {
		t.Errorf("%v AckStream calls started, want one per connection (%d)", n, rounds)
	}
}
