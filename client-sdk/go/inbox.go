// Messages from peer pods: a handler whose return ACKs the message and whose error NACKs it.

package consistd

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

const (
	// DefaultRetryAfter is how long a NACKed message waits before it comes again, unless told otherwise.
	DefaultRetryAfter = time.Second
	// settleTimeout bounds an ACK or NACK, which Serve sends even after its context ended.
	settleTimeout = 10 * time.Second
	// maxReason is the longest NACK reason the daemon accepts, in bytes.
	maxReason = 4096
)

// Message is one message a peer sent to this pod; the sidecar delivers it again until it is ACKed.
type Message struct {
	// ID is the sidecar's id for the message.
	ID string
	// Sender is the sending pod's identity.
	Sender string
	// ResourceID is what the message is about.
	ResourceID string
	// EventID identifies the event of the resource.
	EventID string
	// Payload is the message body.
	Payload []byte
	// ContentType is the payload's MIME type.
	ContentType string
	// DeliveryAttempt is 1 on first delivery, higher after a NACK or a reconnect.
	DeliveryAttempt uint32
	// ReceivedAt is when the sidecar received the message.
	ReceivedAt time.Time
	// TraceParent and TraceState are the W3C trace context the message was sent under (empty when it
	// was sent under none); Context gives it as a parent for spans.
	TraceParent string
	TraceState  string
	// Guard is the guard the sending app sent the message under (SendRequest.Guard): the election, the
	// Lease's namespace and the term it led in; nil for an unguarded send.
	Guard *Guard
}

// Handler processes one message: returning nil ACKs it, returning an error NACKs it with the error's
// text as the reason (wrap the error with Retry to choose the delay).
type Handler func(ctx context.Context, m *Message) error

// Inbox receives the messages peers sent to this pod.
type Inbox struct {
	client *Client
	// RetryAfter is how long a NACKed message waits before it comes again; DefaultRetryAfter when zero.
	RetryAfter time.Duration
}

// Inbox returns the pod's inbox; set RetryAfter on it before Serve to change the NACK delay.
func (c *Client) Inbox() *Inbox { return &Inbox{client: c} }

// retryError carries the delay a handler chose for its NACK.
type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// Retry wraps a handler's error so that the message comes again after the given delay instead of the
// Inbox's RetryAfter.
func Retry(err error, after time.Duration) error {
	return &retryError{err: err, after: after}
}

// Serve calls h with each message, oldest first, one at a time: when h returns nil the message is
// ACKed, when it returns an error the message is NACKed and comes again later. The ACK or NACK of the
// message in hand is sent even if ctx ends meanwhile, so a handler may cancel ctx after its last
// message and Serve returns once that ACK is stored. The ACKs of one client (of all its Serve calls)
// share one AckStream call to the sidecar.
//
// Each call runs in an OpenTelemetry CONSUMER span "process consistd.inbox", child of the span the
// message was sent under (Message.Context) and carried by the ctx h gets; an error marks it failed. The
// span comes from the global tracer provider (otel.Tracer), a no-op unless the app installs one.
//
// Serve reconnects when the sidecar is lost (a message not yet ACKed then comes again). It returns nil
// when ctx ends, or the error (a gRPC status) of a call that reconnecting cannot mend.
func (in *Inbox) Serve(ctx context.Context, h Handler) error {
	var pause backoff
	for {
		err := func() error {
			stream, err := in.client.inbox.Receive(ctx, &pb.ReceiveRequest{})
			if err != nil {
				return err
			}
			for {
				r, err := stream.Recv()
				if err != nil {
					return streamEnded(err, "inbox")
				}
				pause.reset()
				if m := r.GetMessage(); m != nil {
					if err := in.handle(ctx, h, m); err != nil {
						return err
					}
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}()
		switch {
		case ctx.Err() != nil:
			return nil
		case !retryable(err):
			return err
		case !pause.wait(ctx):
			return nil
		}
	}
}

// handle runs h on one message and ACKs or NACKs it. An ACK or NACK lost to an unreachable sidecar is
// not an error: the message comes again.
func (in *Inbox) handle(ctx context.Context, h Handler, m *pb.InboxMessage) error {
	msg := &Message{
		ID: m.GetMessageId(), Sender: m.GetSender(), ResourceID: m.GetResourceId(), EventID: m.GetEventId(),
		Payload: m.GetPayload(), ContentType: m.GetContentType(), DeliveryAttempt: m.GetDeliveryAttempt(),
		ReceivedAt: m.GetReceivedAt().AsTime(), TraceParent: m.GetTraceparent(), TraceState: m.GetTracestate(),
		Guard: guardFrom(m.GetGuard()),
	}
	ctx, span := startProcess(ctx, msg)
	failure := h(ctx, msg)
	// The span ends once the ACK or NACK is settled, so it covers them.
	defer endProcess(span, failure)
	settleCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var err error
	if failure == nil {
		err = in.client.ack(settleCtx, m.GetMessageId())
	} else {
		after := in.RetryAfter
		if after == 0 {
			after = DefaultRetryAfter
		}
		var r *retryError
		if errors.As(failure, &r) {
			after = r.after
		}
		_, err = in.client.inbox.Nack(settleCtx, &pb.NackRequest{MessageId: m.GetMessageId(), RetryAfter: durationpb.New(after), Reason: truncate(failure.Error(), maxReason)})
	}
	if err != nil && !retryable(err) {
		return err
	}
	return nil
}

// ack stores the ACK of a message on the AckStream call every ACK of the client shares; a refused ACK
// fails with the status a unary Ack would have had.
func (c *Client) ack(ctx context.Context, id string) error {
	r, err := c.acked.call(ctx, &pb.AckStreamRequest{MessageId: id})
	if err != nil {
		return err
	}
	if r.GetRefusal() != nil {
		return refused(r.GetRefusal())
	}
	return nil
}

// truncate shortens s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
