// ACK-tracked sends: Send returns once the sidecar stored the message; Sent.Wait gives its outcome.

package consistd

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// earlyOutcomes bounds the outcomes kept because they arrived before their Send answered.
const earlyOutcomes = 10_000

// Destination is where a message goes: ToPeer, ToService or ToElection.
type Destination struct {
	target *pb.Destination
}

// ToPeer sends to one peer sidecar by its peer address, "host:port".
func ToPeer(address string) Destination {
	return Destination{&pb.Destination{Target: &pb.Destination_Peer{Peer: address}}}
}

// ToService sends to every ready endpoint of a Kubernetes Service (namespace empty: the daemon's own);
// endpoints that appear later get the message too.
func ToService(namespace, name string) Destination {
	return Destination{&pb.Destination{Target: &pb.Destination_Service{Service: &pb.ServiceDestination{Namespace: namespace, Name: name}}}}
}

// ToElection sends to every member (candidate) of an election group.
func ToElection(election string) Destination {
	return Destination{&pb.Destination{Target: &pb.Destination_Election{Election: election}}}
}

// SendRequest is one message for a destination.
type SendRequest struct {
	// To is where the message goes.
	To Destination
	// ResourceID is what the message is about: per (destination, resource) one message is in flight and
	// a newer event supersedes an older one not yet ACKed.
	ResourceID string
	// EventID identifies this event of the resource; receivers deduplicate by (sender, resource, event).
	EventID string
	// Payload is the message body.
	Payload []byte
	// ContentType is the payload's MIME type, e.g. "application/json".
	ContentType string
	// TraceParent and TraceState are the W3C trace context the receiving app gets with the message. Send
	// fills them from the span of its ctx when TraceParent is empty; set them to send under another.
	TraceParent string
	TraceState  string
}

// OutcomeKind is how a message's life ended.
type OutcomeKind int32

const (
	// Acked: the receiving app acknowledged the message.
	Acked = OutcomeKind(pb.AckOutcome_ACK_OUTCOME_ACKED)
	// Superseded: a newer event for the same destination and resource replaced it before its ACK.
	Superseded = OutcomeKind(pb.AckOutcome_ACK_OUTCOME_SUPERSEDED)
	// Failed: delivery was given up; Outcome.Reason says why.
	Failed = OutcomeKind(pb.AckOutcome_ACK_OUTCOME_FAILED)
)

// String gives the protocol's name without its prefix: "ACKED", "SUPERSEDED", "FAILED".
func (k OutcomeKind) String() string {
	return strings.TrimPrefix(pb.AckOutcome(k).String(), "ACK_OUTCOME_")
}

// Outcome is how a sent message ended at a receiver.
type Outcome struct {
	// Kind is Acked, Superseded or Failed.
	Kind OutcomeKind
	// Peer is the peer address that answered.
	Peer string
	// Reason says why, for Failed.
	Reason string
	// At is when the outcome was recorded.
	At time.Time
}

// IsAcked reports whether the receiving app acknowledged the message.
func (o Outcome) IsAcked() bool { return o.Kind == Acked }

// Sent is a message the sidecar has stored; Wait gives its outcome (for a Service or election
// destination, the first receiver's).
type Sent struct {
	// MessageID is the sidecar's id for the message.
	MessageID string
	done      chan struct{}
	outcome   Outcome
	err       error
}

// Wait blocks until the message's outcome is known, or ctx ends (then it returns ctx's error). If the
// outcome can no longer be seen (the connection to the sidecar was lost) it returns a gRPC status error.
func (s *Sent) Wait(ctx context.Context) (Outcome, error) {
	select {
	case <-s.done:
		return s.outcome, s.err
	case <-ctx.Done():
		return Outcome{}, ctx.Err()
	}
}

func (s *Sent) settle(o Outcome, err error) {
	s.outcome, s.err = o, err
	close(s.done)
}

// Send stores the message in the sidecar's outbox and returns once it is durable; the sidecar delivers
// it and resends it until the receiving app ACKs. Before the first send the client starts watching the
// outcomes of its sends, so none is missed.
//
// Sends from one client share one SendStream call to the sidecar, so sends made concurrently share its
// disk flush; a refused message fails only its own Send, with the status a unary Send would have had.
// When ctx ends before the sidecar answers, Send returns ctx's status but the message may still be
// stored. When the connection to the sidecar is lost, the sends waiting on it fail with UNAVAILABLE
// (the next Send opens the stream again).
//
// The message carries the W3C trace context of ctx's OpenTelemetry span (trace.SpanContextFromContext)
// to the receiving app, unless req names a TraceParent already or ctx holds no valid span.
func (c *Client) Send(ctx context.Context, req SendRequest) (*Sent, error) {
	stream, err := c.acks.watch(ctx, c)
	if err != nil {
		return nil, err
	}
	injectTrace(ctx, &req)
	r, err := c.sends.call(ctx, &pb.SendStreamRequest{Message: &pb.SendRequest{
		Destination: req.To.target, ResourceId: req.ResourceID, EventId: req.EventID,
		Payload: req.Payload, ContentType: req.ContentType,
		Traceparent: req.TraceParent, Tracestate: req.TraceState,
	}})
	if err != nil {
		return nil, err
	}
	if r.GetRefusal() != nil {
		return nil, refused(r.GetRefusal())
	}
	sent := &Sent{MessageID: r.GetMessageId(), done: make(chan struct{})}
	c.acks.await(sent, stream)
	return sent, nil
}

// refused is the error of a request a streaming call refused: the status a unary call would have had.
func refused(r *pb.Refusal) error {
	return status.Error(codes.Code(r.GetCode()), r.GetMessage())
}

// ackTracker matches the outcomes of one WatchAcks stream at a time to the sends waiting for them.
type ackTracker struct {
	mu sync.Mutex
	// stream numbers the WatchAcks streams opened, so a Send can tell its stream was replaced.
	stream uint64
	// ended is true while no stream runs (before the first Send, and after a stream failed).
	ended bool
	// waiting are the sends whose outcome has not arrived, by message id.
	waiting map[string]*Sent
	// early are outcomes that arrived before their Send answered, oldest first in earlyOrder.
	early      map[string]Outcome
	earlyOrder []string
	// stop releases the running stream's context once it has ended.
	stop context.CancelFunc
}

func newAckTracker() *ackTracker {
	return &ackTracker{ended: true, waiting: map[string]*Sent{}, early: map[string]Outcome{}}
}

// watch opens the WatchAcks stream unless one is running, and returns the running stream's number once
// the daemon has subscribed it (answered with headers).
func (t *ackTracker) watch(ctx context.Context, c *Client) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ended {
		return t.stream, nil
	}
	// The stream outlives this Send: it runs until it fails or the client closes.
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := c.outbox.WatchAcks(streamCtx, &pb.WatchAcksRequest{})
	if err == nil {
		_, err = stream.Header()
	}
	if err != nil {
		cancel()
		return 0, err
	}
	t.stream++
	t.ended = false
	t.stop = cancel
	go t.pump(t.stream, stream.Recv)
	return t.stream, nil
}

// await registers sent, or settles it at once when its outcome came early or can no longer come.
func (t *ackTracker) await(sent *Sent, stream uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o, ok := t.early[sent.MessageID]; ok {
		delete(t.early, sent.MessageID)
		t.earlyOrder = slices.DeleteFunc(t.earlyOrder, func(id string) bool { return id == sent.MessageID })
		sent.settle(o, nil)
		return
	}
	if t.ended || t.stream != stream {
		sent.settle(Outcome{}, status.Errorf(codes.Unavailable, "outcome of message %s: lost the outcome stream", sent.MessageID))
		return
	}
	t.waiting[sent.MessageID] = sent
}

// pump hands each outcome to its waiter until the stream fails; then it fails the sends still waiting
// (their outcomes can no longer be seen) so none waits forever.
func (t *ackTracker) pump(stream uint64, recv func() (*pb.WatchAcksResponse, error)) {
	for {
		r, err := recv()
		if err != nil {
			err = streamEnded(err, "outcome")
			t.mu.Lock()
			defer t.mu.Unlock()
			t.ended = true
			t.stop()
			s := status.Convert(err)
			for id, sent := range t.waiting {
				sent.settle(Outcome{}, status.Errorf(s.Code(), "outcome of message %s: %s", id, s.Message()))
			}
			clear(t.waiting)
			return
		}
		o := Outcome{Kind: OutcomeKind(r.GetOutcome()), Peer: r.GetPeer(), Reason: r.GetReason(), At: r.GetAt().AsTime()}
		t.mu.Lock()
		if sent, ok := t.waiting[r.GetMessageId()]; ok {
			delete(t.waiting, r.GetMessageId())
			sent.settle(o, nil)
		} else {
			t.keepEarly(r.GetMessageId(), o)
		}
		t.mu.Unlock()
	}
}

// keepEarly remembers an outcome whose Send has not answered yet, forgetting the oldest beyond the bound.
func (t *ackTracker) keepEarly(id string, o Outcome) {
	for len(t.earlyOrder) >= earlyOutcomes {
		delete(t.early, t.earlyOrder[0])
		t.earlyOrder = t.earlyOrder[1:]
	}
	t.early[id] = o
	t.earlyOrder = append(t.earlyOrder, id)
}
