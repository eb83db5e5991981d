// When a stream to the sidecar is opened again, and how long to wait before doing so: the values
// proto/consistd/v1/watch.proto states for every client.

package consistd

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// backoffInitial is the first pause before reconnecting.
	backoffInitial = 100 * time.Millisecond
	// backoffCap is the longest pause between reconnects.
	backoffCap = 5 * time.Second
	// deadlineSlack is how long before ctx's deadline a CANCELLED from the sidecar still counts as that
	// deadline: a call carries what was left of it when it went out, so the sidecar's timer may fire first.
	deadlineSlack = time.Second
)

// atDeadline reports whether err is the sidecar ending a call at ctx's deadline. A gRPC server answers
// CANCELLED ("Timeout expired") when the grpc-timeout the client sent runs out, which may be a moment
// before ctx's own timer fires; the caller then waits for ctx and returns its DeadlineExceeded.
func atDeadline(ctx context.Context, err error) bool {
	deadline, ok := ctx.Deadline()
	return ok && status.Code(err) == codes.Canceled && time.Until(deadline) < deadlineSlack
}

// retryable reports whether a failed stream is worth opening again: the sidecar restarted, shut down or
// was not reachable (UNAVAILABLE). Every other code is the daemon's answer to the request and goes to
// the caller.
func retryable(err error) bool {
	return status.Code(err) == codes.Unavailable
}

// streamEnded turns the end of a stream the caller did not stop into the error that makes it reconnect.
func streamEnded(err error, what string) error {
	if errors.Is(err, io.EOF) {
		return status.Errorf(codes.Unavailable, "the sidecar ended the %s stream", what)
	}
	return err
}

// backoff gives doubling pauses from 100 ms up to 5 s, back to the start after a success.
type backoff struct {
	next time.Duration
}

// wait sleeps the current pause and doubles the next one; it reports false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.step())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// step returns the current pause and doubles the next one, for a caller that waits on its own.
func (b *backoff) step() time.Duration {
	if b.next == 0 {
		b.next = backoffInitial
	}
	pause := b.next
	b.next = min(2*b.next, backoffCap)
	return pause
}

// reset starts again from the shortest pause (after the stream delivered something).
func (b *backoff) reset() { b.next = backoffInitial }

// errStopped ends a stream the caller stopped (it broke out of its loop); it never reaches the caller.
var errStopped = errors.New("stopped by the caller")
