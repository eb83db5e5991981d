// Unit tests of the shared stream against a fake one: answers in request order, refusals and callers
// that give up leave the order intact, a broken stream fails its calls as lost and the next call opens
// another, and close ends it.

package consistd

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeStream is a streaming call whose requests the test reads and whose answers (or end) it writes.
type fakeStream struct {
	grpc.ClientStream
	ctx      context.Context
	requests chan string
	answers  chan fakeAnswer
}

type fakeAnswer struct {
	id  string
	err error
}

func (f *fakeStream) Send(req *string) error {
	select {
	case f.requests <- *req:
		return nil
	case <-f.ctx.Done():
		return io.EOF
	}
}

func (f *fakeStream) Recv() (*string, error) {
	select {
	case a := <-f.answers:
		if a.err != nil {
			return nil, a.err
		}
		return &a.id, nil
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

// fakeSidecar opens fake streams and hands each to the test.
type fakeSidecar struct {
	mu     sync.Mutex
	opened []*fakeStream
}

func (s *fakeSidecar) open(ctx context.Context) (grpc.BidiStreamingClient[string, string], error) {
	f := &fakeStream{ctx: ctx, requests: make(chan string, 16), answers: make(chan fakeAnswer, 16)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opened = append(s.opened, f)
	return f, nil
}

// stream is the n-th stream opened (from 1), failing the test if there are fewer.
func (s *fakeSidecar) stream(t *testing.T, n int) *fakeStream {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.opened) != n {
		t.Fatalf("%d streams opened, want %d", len(s.opened), n)
	}
	return s.opened[n-1]
}

// result is what one call returned.
type result struct {
	id  string
	err error
}

// callAsync makes a call in the background and waits until its request is on the stream it went out on.
func callAsync(t *testing.T, ctx context.Context, o *ordered[string, string], s *fakeSidecar, n int, req string) <-chan result {
	t.Helper()
	done := make(chan result, 1)
	go func() {
		id, err := o.call(ctx, &req)
		r := result{err: err}
		if id != nil {
			r.id = *id
		}
		done <- r
	}()
	deadline := time.After(5 * time.Second)
	for {
		s.mu.Lock()
		opened := len(s.opened)
		s.mu.Unlock()
		if opened >= n {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("request %q: no stream %d opened", req, n)
		case <-time.After(time.Millisecond):
		}
	}
	select {
	case got := <-s.stream(t, n).requests:
		if got != req {
			t.Fatalf("request %q on the stream, want %q", got, req)
		}
	case <-deadline:
		t.Fatalf("request %q never reached stream %d", req, n)
	}
	return done
}

// outcome waits for a call's result.
func outcome(t *testing.T, done <-chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not return")
	}
	panic("unreachable")
}

func newFake() (*ordered[string, string], *fakeSidecar) {
	s := &fakeSidecar{}
	return newOrdered("send", s.open), s
}

func TestEachCallGetsTheAnswerInItsPlaceAndOneStreamCarriesThemAll(t *testing.T) {
	o, s := newFake()
	defer o.close()
	ctx := context.Background()
	first, second, third := callAsync(t, ctx, o, s, 1, "1"), callAsync(t, ctx, o, s, 1, "2"), callAsync(t, ctx, o, s, 1, "3")
	f := s.stream(t, 1)
	f.answers <- fakeAnswer{id: "a"}
	f.answers <- fakeAnswer{id: "b"}
	f.answers <- fakeAnswer{id: "c"}
	for i, want := range []string{"a", "b", "c"} {
		if r := outcome(t, []<-chan result{first, second, third}[i]); r.err != nil || r.id != want {
			t.Fatalf("call %d: %q, %v; want %q", i+1, r.id, r.err, want)
		}
	}
	s.stream(t, 1)
}

func TestACallThatGivesUpLeavesItsAnswerBehindAndTheNextCallGetsItsOwn(t *testing.T) {
	o, s := newFake()
	defer o.close()
	ctx, give := context.WithCancel(context.Background())
	impatient := callAsync(t, ctx, o, s, 1, "1")
	patient := callAsync(t, context.Background(), o, s, 1, "2")
	give()
	if r := outcome(t, impatient); status.Code(r.err) != codes.Canceled {
		t.Fatalf("the call that gave up: %q, %v; want CANCELED", r.id, r.err)
	}
	f := s.stream(t, 1)
	f.answers <- fakeAnswer{id: "for 1"}
	f.answers <- fakeAnswer{id: "for 2"}
	if r := outcome(t, patient); r.err != nil || r.id != "for 2" {
		t.Fatalf("the next call: %q, %v; want its own answer \"for 2\"", r.id, r.err)
	}
}

func TestABrokenStreamFailsItsCallsAsLostAndTheNextCallOpensAnother(t *testing.T) {
	for _, end := range []error{io.EOF, status.Error(codes.Unavailable, "error reading from server: EOF")} {
		o, s := newFake()
		waiting := []<-chan result{callAsync(t, context.Background(), o, s, 1, "1"), callAsync(t, context.Background(), o, s, 1, "2")}
		s.stream(t, 1).answers <- fakeAnswer{err: end}
		for _, w := range waiting {
			r := outcome(t, w)
			if status.Code(r.err) != codes.Unavailable || !strings.Contains(r.err.Error(), "send: lost the connection to the sidecar") {
				t.Fatalf("stream ended with %v: a waiting call returned %q, %v; want UNAVAILABLE, lost the connection", end, r.id, r.err)
			}
		}
		again := callAsync(t, context.Background(), o, s, 2, "3")
		s.stream(t, 2).answers <- fakeAnswer{id: "c"}
		if r := outcome(t, again); r.err != nil || r.id != "c" {
			t.Fatalf("the call after the break: %q, %v; want \"c\" on a new stream", r.id, r.err)
		}
		o.close()
	}
}

func TestCloseEndsTheStreamAndEveryLaterCall(t *testing.T) {
	o, s := newFake()
	waiting := callAsync(t, context.Background(), o, s, 1, "1")
	o.close()
	if r := outcome(t, waiting); status.Code(r.err) != codes.Canceled || !strings.Contains(r.err.Error(), "client is closed") {
		t.Fatalf("the waiting call: %q, %v; want CANCELED, the client is closed", r.id, r.err)
	}
	req := "2"
	if _, err := o.call(context.Background(), &req); status.Code(err) != codes.Canceled {
		t.Fatalf("a call after close: %v; want CANCELED", err)
	}
	s.stream(t, 1)
}

func TestTheCallersDeadlineBoundsOpeningTheStreamButNotTheStream(t *testing.T) {
	opened := make(chan context.Context, 1)
	o := newOrdered("ack", func(ctx context.Context) (grpc.BidiStreamingClient[string, string], error) {
		opened <- ctx
		<-ctx.Done() // a sidecar that never answers
		return nil, status.FromContextError(ctx.Err()).Err()
	})
	defer o.close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req := "1"
	if _, err := o.call(ctx, &req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("opening past the deadline: %v; want DEADLINE_EXCEEDED", err)
	}

	// A stream opened in time outlives the call that opened it.
	s := &fakeSidecar{}
	o.open = s.open
	ctx, cancel = context.WithCancel(context.Background())
	first := callAsync(t, ctx, o, s, 1, "2")
	s.stream(t, 1).answers <- fakeAnswer{id: "b"}
	if r := outcome(t, first); r.err != nil || r.id != "b" {
		t.Fatalf("first call: %q, %v", r.id, r.err)
	}
	cancel()
	second := callAsync(t, context.Background(), o, s, 1, "3")
	s.stream(t, 1).answers <- fakeAnswer{id: "c"}
	if r := outcome(t, second); r.err != nil || r.id != "c" {
		t.Fatalf("a call after the opener's ctx ended: %q, %v; want \"c\" on the same stream", r.id, r.err)
	}
	if errors.Is(s.stream(t, 1).ctx.Err(), context.Canceled) {
		t.Fatal("the stream ended with the ctx of the call that opened it")
	}
}
