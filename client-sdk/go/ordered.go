// One long-lived bidirectional stream shared by many calls (SendStream, AckStream): each call's request
// goes out on it and its answer comes back in request order, so calls made together share the sidecar's
// disk flush instead of each paying for a unary call of its own.

package consistd

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ordered is a shared stream, opened by the first call and again by the first call after it broke.
type ordered[Req, Resp any] struct {
	// what names the operation in errors: "send", "ack".
	what string
	// open starts the streaming call; the stream lives as long as its ctx.
	open func(ctx context.Context) (grpc.BidiStreamingClient[Req, Resp], error)
	// life is the client's: close cancels it, and with it every stream.
	life context.Context
	stop context.CancelFunc
	// turn is held (one token) by the call writing its request, so requests go out in the order their
	// answers are awaited; it guards cur.
	turn chan struct{}
	cur  *orderedStream[Req, Resp]
}

// orderedStream is one streaming call and the calls waiting for its answers.
type orderedStream[Req, Resp any] struct {
	client grpc.BidiStreamingClient[Req, Resp]
	cancel context.CancelFunc
	mu     sync.Mutex
	// waiting are the calls' answer channels (buffered, one answer each), oldest first.
	waiting []chan<- answer[Resp]
	// broken is the error the stream ended with; then nothing waits on it any more.
	broken error
}

type answer[Resp any] struct {
	resp *Resp
	err  error
}

func newOrdered[Req, Resp any](what string, open func(context.Context) (grpc.BidiStreamingClient[Req, Resp], error)) *ordered[Req, Resp] {
	life, stop := context.WithCancel(context.Background())
	return &ordered[Req, Resp]{what: what, open: open, life: life, stop: stop, turn: make(chan struct{}, 1)}
}

// call sends req on the stream, opening one if none is open or the open one broke, and waits for its
// answer. When ctx ends first, call returns ctx's status (DEADLINE_EXCEEDED or CANCELED) but the request
// stays on the stream: its answer, when it comes, is dropped. A broken stream fails the calls waiting on
// it with UNAVAILABLE, "lost the connection to the sidecar"; the next call opens a new one.
func (o *ordered[Req, Resp]) call(ctx context.Context, req *Req) (*Resp, error) {
	answers := make(chan answer[Resp], 1)
	if err := o.write(ctx, req, answers); err != nil {
		return nil, err
	}
	select {
	case a := <-answers:
		return a.resp, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// write queues the call's answer channel and sends its request, both in its turn.
func (o *ordered[Req, Resp]) write(ctx context.Context, req *Req, answers chan<- answer[Resp]) error {
	select {
	case o.turn <- struct{}{}:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	defer func() { <-o.turn }()
	if o.life.Err() != nil {
		return o.closed()
	}
	if o.cur == nil || o.cur.wait(answers) != nil {
		s, err := o.start(ctx)
		if err != nil {
			return err
		}
		o.cur = s
		if err := s.wait(answers); err != nil {
			return err
		}
	}
	// Transport failures come back as io.EOF and break the stream: its reader then fails this call. Any
	// other error is this request's own (too large to send, say); grpc ends the stream for it too.
	if err := o.cur.client.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// start opens a stream that outlives ctx, which bounds only the opening, and starts its reader.
func (o *ordered[Req, Resp]) start(ctx context.Context) (*orderedStream[Req, Resp], error) {
	streamCtx, cancel := context.WithCancel(o.life)
	opening := context.AfterFunc(ctx, cancel)
	client, err := o.open(streamCtx)
	if !opening() {
		cancel()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	s := &orderedStream[Req, Resp]{client: client, cancel: cancel}
	go o.read(s)
	return s, nil
}

// read hands each answer to the oldest waiting call until the stream breaks; then it fails the calls
// still waiting, so none waits forever.
func (o *ordered[Req, Resp]) read(s *orderedStream[Req, Resp]) {
	for {
		resp, err := s.client.Recv()
		if err != nil {
			s.fail(o.lost(err))
			return
		}
		s.mu.Lock()
		var next chan<- answer[Resp]
		if len(s.waiting) > 0 {
			next = s.waiting[0]
			s.waiting[0] = nil
			s.waiting = s.waiting[1:]
		}
		s.mu.Unlock()
		if next != nil {
			next <- answer[Resp]{resp: resp}
		}
	}
}

// lost is the error of the calls a broken stream leaves waiting: UNAVAILABLE, as for a unary call that
// could not reach the sidecar, so the same retries apply; CANCELED once the client is closed.
func (o *ordered[Req, Resp]) lost(err error) error {
	if o.life.Err() != nil {
		return o.closed()
	}
	cause := "the sidecar ended the stream"
	if !errors.Is(err, io.EOF) {
		cause = status.Convert(err).Message()
	}
	return status.Errorf(codes.Unavailable, "%s: lost the connection to the sidecar: %s", o.what, cause)
}

func (o *ordered[Req, Resp]) closed() error {
	return status.Errorf(codes.Canceled, "%s: the client is closed", o.what)
}

// close ends the stream; the calls waiting on it, and every later call, fail with CANCELED.
func (o *ordered[Req, Resp]) close() { o.stop() }

// wait queues a call's answer channel, unless the stream broke (then it returns why).
func (s *orderedStream[Req, Resp]) wait(answers chan<- answer[Resp]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return s.broken
	}
	s.waiting = append(s.waiting, answers)
	return nil
}

// fail marks the stream broken with err and fails every waiting call with it.
func (s *orderedStream[Req, Resp]) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.broken = err
	for _, w := range s.waiting {
		w <- answer[Resp]{err: err}
	}
	s.waiting = nil
	s.cancel()
}
