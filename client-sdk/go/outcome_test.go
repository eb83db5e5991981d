// Tests of awaiting a send's outcome against the harness's daemons: an outcome that came while the app's
// connection to its sidecar was cut, a superseded message, a deadline that ends one wait, a sidecar that
// restarted since the message settled, and sends never waited for.

package consistd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// waited is what one Sent.Wait returned.
type waited struct {
	outcome consistd.Outcome
	err     error
}

// waitInBackground runs sent.Wait(ctx) on a goroutine of its own.
func waitInBackground(sent *consistd.Sent, ctx context.Context) <-chan waited {
	done := make(chan waited, 1)
	go func() {
		o, err := sent.Wait(ctx)
		done <- waited{o, err}
	}()
	return done
}

// holdEvent serves the peer daemon's inbox until the test ends: it ACKs every message, but holds the
// message about resource with event (reporting it on held first) until release is called (or the test
// ends).
func holdEvent(t *testing.T, resource, event string) (held <-chan *consistd.Message, release func()) {
	received, released := make(chan *consistd.Message, 16), make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	serveInbox(t, func(ctx context.Context, m *consistd.Message) error {
		if m.ResourceID != resource || m.EventID != event {
			return nil
		}
		received <- m
		select {
		case <-released:
		case <-ctx.Done():
		}
		return nil
	})
	t.Cleanup(release)
	return received, release
}

// receive takes the next message from ch, failing the test after waitFor.
func receive(t *testing.T, ch <-chan *consistd.Message, what string) *consistd.Message {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(waitFor):
		t.Fatalf("%s was not delivered within %s", what, waitFor)
	}
	panic("unreachable")
}

// sidecarOutcome asks the sidecar behind c for the outcome of message id itself (WaitOutcome), leaving
// every Sent as it was.
func sidecarOutcome(t *testing.T, c *consistd.Client, id string) *pb.WatchAcksResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), waitFor)
	defer cancel()
	r, err := pb.NewOutboxServiceClient(c.Conn()).WaitOutcome(ctx, &pb.WaitOutcomeRequest{MessageId: id})
	if err != nil {
		t.Fatalf("WaitOutcome for %s: %v", id, err)
	}
	return r.GetOutcome()
}

// waitForCalls polls until the daemon behind admin has started more than `after` calls of method of the
// OutboxService.
func waitForCalls(t *testing.T, admin, method string, after float64) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for callsStarted(t, admin, outboxService, method) <= after {
		if time.Now().After(deadline) {
			t.Fatalf("no %s call started within %s", method, waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAnOutcomeThatCameWhileTheConnectionWasCutIsSeenOnceItIsBack(t *testing.T) {
	adminA := env(t, "CONSISTD_TEST_ADMIN_SOCKET")
	toA := startProxy(t, env(t, "CONSISTD_SOCKET"))
	a, direct := ready(t, toA.Socket), ready(t, "")
	resource := unique("go-cut-outcome")
	held, release := holdEvent(t, resource, "1")

	sent := send(t, a, resource, "1", "x")
	receive(t, held, "the message")
	before := callsStarted(t, adminA, outboxService, "WaitOutcome")
	done := waitInBackground(sent, testContext(t))
	waitForCalls(t, adminA, "WaitOutcome", before)

	// The app's connection is cut with its wait in flight, and stays down while the receiver ACKs.
	toA.down()
	release()
	if o := sidecarOutcome(t, direct, sent.MessageID); o.GetOutcome() != pb.AckOutcome_ACK_OUTCOME_ACKED {
		t.Fatalf("the sidecar's outcome of %s: %s, want ACKED", sent.MessageID, o.GetOutcome())
	}
	select {
	case w := <-done:
		t.Fatalf("the wait returned while the connection was down: %+v, %v", w.outcome, w.err)
	case <-time.After(500 * time.Millisecond):
	}

	connections := toA.connections()
	toA.up()
	select {
	case w := <-done:
		if w.err != nil || w.outcome.Kind != consistd.Acked || w.outcome.Peer == "" {
			t.Fatalf("the wait across the cut: %+v, %v; want ACKED by the peer", w.outcome, w.err)
		}
	case <-time.After(waitFor):
		t.Fatalf("the wait did not return within %s of the connection coming back", waitFor)
	}
	if toA.connections() == connections {
		t.Fatal("the outcome came without a new connection to the sidecar")
	}
}

func TestASupersededMessageWaitsToSupersededAndTheNewerOneToAcked(t *testing.T) {
	adminA := env(t, "CONSISTD_TEST_ADMIN_SOCKET")
	a := ready(t, "")
	resource := unique("go-superseded")
	held, release := holdEvent(t, resource, "1")

	older := send(t, a, resource, "1", "older")
	receive(t, held, "the older event")
	// Before the receiver ACKs it, a newer event of the same resource replaces it.
	newer := send(t, a, resource, "2", "newer")
	if o := waitOutcome(t, older); o.Kind != consistd.Superseded {
		t.Fatalf("outcome of the older event %s (reason %q), want SUPERSEDED", o.Kind, o.Reason)
	}
	release()
	if o := waitOutcome(t, newer); o.Kind != consistd.Acked {
		t.Fatalf("outcome of the newer event %s (reason %q), want ACKED", o.Kind, o.Reason)
	}

	// Once obtained, an outcome is given again without asking the sidecar.
	calls := callsStarted(t, adminA, outboxService, "WaitOutcome")
	if o := waitOutcome(t, older); o.Kind != consistd.Superseded {
		t.Fatalf("outcome of the older event asked again %s, want SUPERSEDED", o.Kind)
	}
	if o := waitOutcome(t, newer); o.Kind != consistd.Acked {
		t.Fatalf("outcome of the newer event asked again %s, want ACKED", o.Kind)
	}
	if n := callsStarted(t, adminA, outboxService, "WaitOutcome") - calls; n != 0 {
		t.Fatalf("asking again started %v WaitOutcome calls, want 0", n)
	}
}

func TestADeadlineEndsOneWaitAndTheNextWaitGetsTheOutcome(t *testing.T) {
	a := ready(t, "")
	resource := unique("go-deadline")
	held, release := holdEvent(t, resource, "1")

	sent := send(t, a, resource, "1", "x")
	receive(t, held, "the message")
	ctx, cancel := context.WithTimeout(testContext(t), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	select {
	case w := <-waitInBackground(sent, ctx):
		if !errors.Is(w.err, context.DeadlineExceeded) {
			t.Fatalf("the wait with a 300ms deadline: %+v, %v; want context.DeadlineExceeded", w.outcome, w.err)
		}
		if elapsed := time.Since(start); elapsed < 300*time.Millisecond {
			t.Fatalf("the wait ended after %s, before its deadline", elapsed)
		}
	case <-time.After(waitFor):
		t.Fatalf("the wait with a 300ms deadline did not end within %s", waitFor)
	}

	release()
	if o := waitOutcome(t, sent); o.Kind != consistd.Acked {
		t.Fatalf("the next wait: outcome %s (reason %q), want ACKED", o.Kind, o.Reason)
	}
}

func TestAnOutcomeTheSidecarNoLongerKnowsIsNotFoundAsItSaidIt(t *testing.T) {
	d := startDaemon(t, "sdk-go-outcome", "peer:", "  insecure: true", "outbox:", "  backoff:", "    initial: 50ms", "    cap: 1s")
	c := ready(t, d.Socket)
	resource := unique("go-forgotten")
	serveInbox(t, func(context.Context, *consistd.Message) error { return nil })

	awaited := send(t, c, resource, "1", "x")
	if o := waitOutcome(t, awaited); o.Kind != consistd.Acked {
		t.Fatalf("outcome %s (reason %q), want ACKED", o.Kind, o.Reason)
	}
	// This one settles too, but only the test asks the sidecar: its Sent has not seen the outcome.
	forgotten := send(t, c, resource+"-b", "1", "y")
	if o := sidecarOutcome(t, c, forgotten.MessageID); o.GetOutcome() != pb.AckOutcome_ACK_OUTCOME_ACKED {
		t.Fatalf("the sidecar's outcome of %s: %s, want ACKED", forgotten.MessageID, o.GetOutcome())
	}

	// A restarted sidecar keeps no outcome from before.
	d.stop()
	d.start()
	if err := c.WaitReady(testContext(t), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(testContext(t), waitFor)
	defer cancel()
	_, err := forgotten.Wait(ctx)
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.NotFound || !strings.HasPrefix(s.Message(), fmt.Sprintf("message %s: ", forgotten.MessageID)) ||
		!strings.Contains(s.Message(), "before this daemon started") {
		t.Fatalf("waiting after the restart: %v; want NOT_FOUND as the sidecar says it (message %s: ... before this daemon started ...)", err, forgotten.MessageID)
	}
	// The outcome a Wait obtained before the restart is still given.
	if o, err := awaited.Wait(ctx); err != nil || o.Kind != consistd.Acked {
		t.Fatalf("the outcome obtained before the restart: %+v, %v; want ACKED", o, err)
	}
}

func TestSendsNeverWaitedForStartNoFurtherCall(t *testing.T) {
	adminA := env(t, "CONSISTD_TEST_ADMIN_SOCKET")
	started := func() [3]float64 {
		return [3]float64{
			callsStarted(t, adminA, outboxService, "SendStream"), callsStarted(t, adminA, outboxService, "WatchAcks"),
			callsStarted(t, adminA, outboxService, "WaitOutcome"),
		}
	}
	before := started()
	a := ready(t, "")
	prefix := unique("go-unwaited")
	const sends = 20
	received := make(chan string, sends)
	serveInbox(t, func(_ context.Context, m *consistd.Message) error {
		if strings.HasPrefix(m.ResourceID, prefix) {
			received <- m.ResourceID
		}
		return nil
	})
	var last *consistd.Sent
	for i := range sends {
		last = send(t, a, fmt.Sprintf("%s-%d", prefix, i), "1", "x")
	}
	for range sends {
		select {
		case <-received:
		case <-time.After(waitFor):
			t.Fatalf("not every message was delivered within %s", waitFor)
		}
	}
	if o := sidecarOutcome(t, ready(t, ""), last.MessageID); o.GetOutcome() != pb.AckOutcome_ACK_OUTCOME_ACKED {
		t.Fatalf("the sidecar's outcome of the last send: %s, want ACKED", o.GetOutcome())
	}

	after := started()
	// The test's own WaitOutcome above is the only one.
	for i, want := range [3]float64{1, 0, 1} {
		name := [3]string{"SendStream", "WatchAcks", "WaitOutcome"}[i]
		if got := after[i] - before[i]; got != want {
			t.Errorf("%s started %v times, want %v", name, got, want)
		}
	}
	// The outcomes are there for a Wait that comes later.
	if o := waitOutcome(t, last); o.Kind != consistd.Acked {
		t.Fatalf("outcome of the last send %s, want ACKED", o.Kind)
	}
}
