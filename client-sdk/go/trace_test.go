// Tests of trace context through the SDK, between the harness's two daemons: a message sent under a span
// reaches the receiving handler inside a CONSUMER span that is that span's child; a send under no span,
// or with its own traceparent, is delivered as such. Spans go to an in-memory recorder behind the global
// tracer provider, installed once for the test binary (these tests do not run in parallel).

package consistd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

var (
	recorderOnce sync.Once
	recorder     *tracetest.SpanRecorder
)

// spans returns the recorder behind the global tracer provider, installing it on first use.
func spans() *tracetest.SpanRecorder {
	recorderOnce.Do(func() {
		recorder = tracetest.NewSpanRecorder()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder)))
	})
	return recorder
}

// endedSpan waits until the span with the given id has ended and returns it.
func endedSpan(t *testing.T, id trace.SpanID) sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		for _, s := range spans().Ended() {
			if s.SpanContext().SpanID() == id {
				return s
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("span %s did not end within %s", id, waitFor)
	return nil
}

// attr is the value of a span's attribute key, and whether it has one.
func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// sendUnder sends req to the peer daemon through a under ctx and waits for its ACK.
func sendUnder(t *testing.T, ctx context.Context, a *consistd.Client, req consistd.SendRequest) {
	t.Helper()
	req.To = consistd.ToPeer(env(t, "CONSISTD_TEST_PEER_ADDRESS"))
	req.EventID, req.Payload, req.ContentType = "1", []byte("{}"), "application/json"
	sent, err := a.Send(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if o := waitOutcome(t, sent); o.Kind != consistd.Acked {
		t.Fatalf("outcome %s (reason %q), want ACKED", o.Kind, o.Reason)
	}
}

// handled is what a handler saw of one delivery.
type handled struct {
	message *consistd.Message
	// span is the span context of the ctx the handler got.
	span trace.SpanContext
}

// nextHandled is the next delivery a handler reported, failing the test after waitFor.
func nextHandled(t *testing.T, seen <-chan handled) handled {
	t.Helper()
	select {
	case h := <-seen:
		return h
	case <-time.After(waitFor):
		t.Fatalf("no delivery within %s", waitFor)
	}
	panic("unreachable")
}

func TestAHandlerRunsInAConsumerSpanUnderTheSendersSpanAndAFailureMarksIt(t *testing.T) {
	spans()
	a := ready(t, "")
	resource := unique("go-traced")
	seen := make(chan handled, 16)
	serveInbox(t, func(ctx context.Context, m *consistd.Message) error {
		if m.ResourceID != resource {
			return nil
		}
		seen <- handled{m, trace.SpanContextFromContext(ctx)}
		if m.DeliveryAttempt == 1 {
			return errors.New("not yet")
		}
		return nil
	})

	ctx, producer := otel.Tracer("test").Start(testContext(t), "producer")
	traceID, producerID := producer.SpanContext().TraceID(), producer.SpanContext().SpanID()
	sendUnder(t, ctx, a, consistd.SendRequest{ResourceID: resource})
	producer.End()

	first := nextHandled(t, seen)
	if first.message.DeliveryAttempt != 1 {
		t.Fatalf("first delivery is attempt %d", first.message.DeliveryAttempt)
	}
	if want := fmt.Sprintf("00-%s-%s-01", traceID, producerID); first.message.TraceParent != want {
		t.Fatalf("traceparent %q, want the sender's span %q", first.message.TraceParent, want)
	}
	if first.span.TraceID() != traceID || first.span.SpanID() == producerID || first.span.IsRemote() {
		t.Fatalf("the handler ran in span %s of trace %s, want a local span of its own in the sender's trace %s",
			first.span.SpanID(), first.span.TraceID(), traceID)
	}
	second := nextHandled(t, seen)
	if second.message.DeliveryAttempt != 2 || second.span.TraceID() != traceID || second.span.SpanID() == first.span.SpanID() {
		t.Fatalf("redelivery: attempt %d in span %s of trace %s, want attempt 2 in a new span of trace %s",
			second.message.DeliveryAttempt, second.span.SpanID(), second.span.TraceID(), traceID)
	}

	failed := endedSpan(t, first.span.SpanID())
	if failed.Name() != "process consistd.inbox" || failed.SpanKind() != trace.SpanKindConsumer {
		t.Fatalf("span %q of kind %s, want CONSUMER span \"process consistd.inbox\"", failed.Name(), failed.SpanKind())
	}
	if failed.Parent().SpanID() != producerID || !failed.Parent().IsRemote() {
		t.Fatalf("consumer span's parent %s (remote %t), want the sending span %s", failed.Parent().SpanID(), failed.Parent().IsRemote(), producerID)
	}
	if st := failed.Status(); st.Code != codes.Error || st.Description != "not yet" {
		t.Fatalf("status of the failed handling %s %q, want Error \"not yet\"", st.Code, st.Description)
	}
	if v, _ := attr(failed, "messaging.system"); v.AsString() != "consistd" {
		t.Fatalf("messaging.system %q, want consistd", v.Emit())
	}
	if v, _ := attr(failed, "messaging.message.id"); v.AsString() != first.message.ID {
		t.Fatalf("messaging.message.id %q, want %q", v.Emit(), first.message.ID)
	}
	if len(failed.Events()) == 0 || failed.Events()[0].Name != "exception" {
		t.Fatalf("the failed handling's span recorded no error: events %v", failed.Events())
	}
	if done := endedSpan(t, second.span.SpanID()); done.Status().Code == codes.Error || done.Parent().SpanID() != producerID {
		t.Fatalf("the successful handling's span has status %s and parent %s, want no error under %s",
			done.Status().Code, done.Parent().SpanID(), producerID)
	}
}

func TestASendUnderNoSpanOrWithItsOwnTraceparentIsDeliveredAsSuch(t *testing.T) {
	spans()
	a := ready(t, "")
	untraced, explicit := unique("go-untraced"), unique("go-own-trace")
	received := make(chan *consistd.Message, 16)
	serveInbox(t, func(_ context.Context, m *consistd.Message) error {
		if m.ResourceID == untraced || m.ResourceID == explicit {
			received <- m
		}
		return nil
	})
	const own, ownTrace, ownSpan = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"

	sendUnder(t, testContext(t), a, consistd.SendRequest{ResourceID: untraced})
	ctx, producer := otel.Tracer("test").Start(testContext(t), "producer")
	defer producer.End()
	sendUnder(t, ctx, a, consistd.SendRequest{ResourceID: explicit, TraceParent: own, TraceState: "v=1"})

	for range 2 {
		var m *consistd.Message
		select {
		case m = <-received:
		case <-time.After(waitFor):
			t.Fatalf("no delivery within %s", waitFor)
		}
		// A parent holding a span of its own: the message's context replaces it.
		parent := m.Context(ctx)
		sc := trace.SpanContextFromContext(parent)
		switch m.ResourceID {
		case untraced:
			if m.TraceParent != "" || m.TraceState != "" {
				t.Fatalf("a message sent under no span arrived with traceparent %q tracestate %q", m.TraceParent, m.TraceState)
			}
			if sc.IsValid() {
				t.Fatalf("a message sent under no span has parent %s/%s", sc.TraceID(), sc.SpanID())
			}
		case explicit:
			if m.TraceParent != own || m.TraceState != "v=1" {
				t.Fatalf("traceparent %q tracestate %q, want the request's own %q \"v=1\"", m.TraceParent, m.TraceState, own)
			}
			if !sc.IsRemote() || sc.TraceID().String() != ownTrace || sc.SpanID().String() != ownSpan || !sc.IsSampled() || sc.TraceState().String() != "v=1" {
				t.Fatalf("parent %s/%s remote %t sampled %t tracestate %q, want remote %s/%s sampled \"v=1\"",
					sc.TraceID(), sc.SpanID(), sc.IsRemote(), sc.IsSampled(), sc.TraceState(), ownTrace, ownSpan)
			}
		}
	}
}
