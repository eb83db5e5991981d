// Sends with an awaitable outcome: Send returns once the sidecar stored the message; Sent.Wait asks the
// sidecar for its outcome.

package consistd

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

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
	// Guard, when set, sends the message only while the sidecar leads Guard.Election in exactly
	// Guard.Term (else Send fails with FAILED_PRECONDITION, "guard: ..."), and carries that claim to the
	// receiving sidecar, which hands it to the app (Message.Guard): once that sidecar stored a message of
	// a later term of the same election, it refuses this one for good and the outcome is Failed, its
	// Reason naming both terms. nil sends the message unguarded.
	Guard *Guard
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
// destination, the first receiver's). It is safe for concurrent use.
type Sent struct {
	// MessageID is the sidecar's id for the message.
	MessageID string
	outbox    pb.OutboxServiceClient
	// outcome is the outcome once a Wait obtained it; nil before.
	outcome atomic.Pointer[Outcome]
}

// Wait blocks until the message's first outcome (Acked, Superseded or Failed) is known and returns it.
// Each Wait asks the sidecar (OutboxService.WaitOutcome), which answers at once when the outcome came
// already; once a Wait has obtained the outcome, Wait returns it without asking again.
//
// When ctx ends first, Wait returns ctx's error; waiting again goes on waiting, and misses nothing. A
// lost connection to the sidecar (UNAVAILABLE) is retried with backoff from 100 ms to 5 s, so an outcome
// that came while the connection was down is still seen. Every other error is the sidecar's answer, a
// gRPC status error with its code and message: NOT_FOUND when the sidecar no longer knows the outcome (it
// restarted since the message settled, or keeps only the last 10,000 outcomes).
func (s *Sent) Wait(ctx context.Context) (Outcome, error) {
	if o := s.outcome.Load(); o != nil {
		return *o, nil
	}
	var pause backoff
	for {
		r, err := s.outbox.WaitOutcome(ctx, &pb.WaitOutcomeRequest{MessageId: s.MessageID})
		switch {
		case err == nil:
			o := outcomeFrom(r.GetOutcome())
			// Every answer is the same first outcome; the first one kept is as good as any.
			s.outcome.CompareAndSwap(nil, &o)
			return *s.outcome.Load(), nil
		case ctx.Err() != nil:
			return Outcome{}, ctx.Err()
		case atDeadline(ctx, err):
			<-ctx.Done()
			return Outcome{}, ctx.Err()
		case !retryable(err):
			return Outcome{}, err
		case !pause.wait(ctx):
			return Outcome{}, ctx.Err()
		}
	}
}

// outcomeFrom is the protocol's outcome as an Outcome.
func outcomeFrom(r *pb.WatchAcksResponse) Outcome {
	return Outcome{Kind: OutcomeKind(r.GetOutcome()), Peer: r.GetPeer(), Reason: r.GetReason(), At: r.GetAt().AsTime()}
}

// Send stores the message in the sidecar's outbox and returns once it is durable; the sidecar delivers
// it and resends it until the receiving app ACKs. The returned Sent's Wait gives the message's outcome;
// a Sent never waited for costs nothing more.
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
	injectTrace(ctx, &req)
	r, err := c.sends.call(ctx, &pb.SendStreamRequest{Message: &pb.SendRequest{
		Destination: req.To.target, ResourceId: req.ResourceID, EventId: req.EventID,
		Payload: req.Payload, ContentType: req.ContentType,
		Traceparent: req.TraceParent, Tracestate: req.TraceState, Guard: req.Guard.proto(),
	}})
	if err != nil {
		return nil, err
	}
	if r.GetRefusal() != nil {
		return nil, refused(r.GetRefusal())
	}
	return &Sent{MessageID: r.GetMessageId(), outbox: c.outbox}, nil
}

// refused is the error of a request a streaming call refused: the status a unary call would have had.
func refused(r *pb.Refusal) error {
	return status.Error(codes.Code(r.GetCode()), r.GetMessage())
}
