// Unit tests of Sent.Wait against a fake outbox service: a lost connection is retried with backoff, every
// other status comes back unchanged, ctx bounds one wait, and an outcome once obtained is kept. And of
// Send against a fake stream: what it puts on the stream.

package consistd

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// fakeOutbox answers WaitOutcome with answer (given the call's number, from 1) and counts the calls.
type fakeOutbox struct {
	pb.OutboxServiceClient
	t      *testing.T
	answer func(ctx context.Context, call int) (*pb.WaitOutcomeResponse, error)
	mu     sync.Mutex
	calls  int
}

func (f *fakeOutbox) WaitOutcome(ctx context.Context, req *pb.WaitOutcomeRequest, _ ...grpc.CallOption) (*pb.WaitOutcomeResponse, error) {
	if req.GetMessageId() != "7" {
		f.t.Errorf("WaitOutcome for message %q, want 7", req.GetMessageId())
	}
	f.mu.Lock()
	f.calls++
	call := f.calls
	f.mu.Unlock()
	return f.answer(ctx, call)
}

func (f *fakeOutbox) called() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// acked is the answer for message 7 ACKed by peer p.
func acked() *pb.WaitOutcomeResponse {
	return &pb.WaitOutcomeResponse{Outcome: &pb.WatchAcksResponse{
		MessageId: "7", Peer: "p", Outcome: pb.AckOutcome_ACK_OUTCOME_ACKED, At: timestamppb.New(time.Unix(1, 0)),
	}}
}

// cut is what gRPC answers for a call whose ctx ended.
func cut(ctx context.Context) (*pb.WaitOutcomeResponse, error) {
	return nil, status.FromContextError(ctx.Err()).Err()
}

// waitErr is the error of sent.Wait(ctx), which must return within 5 s.
func waitErr(t *testing.T, sent *Sent, ctx context.Context) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := sent.Wait(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return within 5 s")
	}
	panic("unreachable")
}

func TestWaitRetriesALostConnectionWithBackoffThenKeepsTheOutcome(t *testing.T) {
	outbox := &fakeOutbox{t: t, answer: func(_ context.Context, call int) (*pb.WaitOutcomeResponse, error) {
		if call <= 2 {
			return nil, status.Error(codes.Unavailable, "connection refused")
		}
		return acked(), nil
	}}
	sent := &Sent{MessageID: "7", outbox: outbox}
	start := time.Now()
	o, err := sent.Wait(context.Background())
	if err != nil || o.Kind != Acked || o.Peer != "p" || !o.At.Equal(time.Unix(1, 0)) {
		t.Fatalf("Wait: %+v, %v; want ACKED by p at 1s", o, err)
	}
	if outbox.called() != 3 {
		t.Fatalf("%d calls, want 3 (two lost, one answered)", outbox.called())
	}
	if elapsed := time.Since(start); elapsed < 300*time.Millisecond {
		t.Fatalf("answered after %s: the retries did not wait 100 ms then 200 ms", elapsed)
	}

	// Asked again, even concurrently and with a ctx already ended, the outcome comes without a call.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if o, err := sent.Wait(ended); err != nil || o.Kind != Acked {
				t.Errorf("Wait again: %+v, %v; want ACKED", o, err)
			}
		})
	}
	wg.Wait()
	if outbox.called() != 3 {
		t.Fatalf("%d calls after asking again, want still 3", outbox.called())
	}
}

func TestWaitReturnsEveryOtherStatusAsTheSidecarSentIt(t *testing.T) {
	for _, code := range []codes.Code{codes.NotFound, codes.InvalidArgument, codes.PermissionDenied, codes.Internal} {
		sent := &Sent{MessageID: "7", outbox: &fakeOutbox{t: t, answer: func(context.Context, int) (*pb.WaitOutcomeResponse, error) {
			return nil, status.Error(code, "message 7: its outcome is not known")
		}}}
		_, err := sent.Wait(context.Background())
		s, ok := status.FromError(err)
		if !ok || s.Code() != code || s.Message() != "message 7: its outcome is not known" {
			t.Errorf("Wait: %v; want %s with the sidecar's message", err, code)
		}
		if n := sent.outbox.(*fakeOutbox).called(); n != 1 {
			t.Errorf("%s: %d calls, want 1 (not retried)", code, n)
		}
	}
}

// The sidecar ends a call when the grpc-timeout it carries runs out, answering CANCELLED, which can come a
// moment before ctx's own deadline: Wait still ends with ctx's DeadlineExceeded, at the deadline. A CANCELLED
// far from the deadline is the sidecar's answer and goes to the caller as it is.
func TestACancelledAnswerAtTheDeadlineIsTheDeadline(t *testing.T) {
	cancelled := func(context.Context, int) (*pb.WaitOutcomeResponse, error) {
		return nil, status.Error(codes.Canceled, "Timeout expired")
	}
	sent := &Sent{MessageID: "7", outbox: &fakeOutbox{t: t, answer: cancelled}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := waitErr(t, sent, ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v; want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed < 300*time.Millisecond {
		t.Fatalf("Wait ended after %s, before its deadline", elapsed)
	}
	far, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	sent = &Sent{MessageID: "7", outbox: &fakeOutbox{t: t, answer: cancelled}}
	if err := waitErr(t, sent, far); status.Code(err) != codes.Canceled {
		t.Fatalf("Wait an hour before its deadline: %v; want the sidecar's CANCELLED", err)
	}
}

func TestCtxEndsOneWaitAndWaitingAgainGetsTheOutcome(t *testing.T) {
	answer := make(chan struct{})
	outbox := &fakeOutbox{t: t, answer: func(ctx context.Context, call int) (*pb.WaitOutcomeResponse, error) {
		select {
		case <-answer:
			return acked(), nil
		case <-ctx.Done():
			return cut(ctx)
		}
	}}
	sent := &Sent{MessageID: "7", outbox: outbox}

	// A deadline ends the wait with ctx's error, not a gRPC status.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := waitErr(t, sent, ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v, want context.DeadlineExceeded", err)
	}
	// So does a cancellation.
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := waitErr(t, sent, ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v, want context.Canceled", err)
	}

	close(answer)
	if o, err := sent.Wait(context.Background()); err != nil || o.Kind != Acked {
		t.Fatalf("Wait again: %+v, %v; want ACKED", o, err)
	}
}

func TestCtxEndingWhileALostConnectionIsRetriedEndsTheWaitWithCtxsError(t *testing.T) {
	outbox := &fakeOutbox{t: t, answer: func(context.Context, int) (*pb.WaitOutcomeResponse, error) {
		return nil, status.Error(codes.Unavailable, "connection refused")
	}}
	sent := &Sent{MessageID: "7", outbox: outbox}
	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := waitErr(t, sent, ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v, want context.DeadlineExceeded", err)
	}
	// Calls at 0, 100, 300 and 700 ms; the deadline falls in the 800 ms pause after them, and ends it.
	if elapsed := time.Since(start); elapsed > 1200*time.Millisecond {
		t.Fatalf("Wait returned %s after its start: its 800 ms deadline did not end the pause", elapsed)
	}
	if n := outbox.called(); n < 2 {
		t.Fatalf("%d calls within 800 ms, want the lost connection retried", n)
	}
}

func TestConcurrentWaitsAllGetTheOutcome(t *testing.T) {
	answer := make(chan struct{})
	outbox := &fakeOutbox{t: t, answer: func(ctx context.Context, _ int) (*pb.WaitOutcomeResponse, error) {
		select {
		case <-answer:
			return acked(), nil
		case <-ctx.Done():
			return cut(ctx)
		}
	}}
	sent := &Sent{MessageID: "7", outbox: outbox}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if o, err := sent.Wait(context.Background()); err != nil || o.Kind != Acked {
				t.Errorf("Wait: %+v, %v; want ACKED", o, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(answer)
	wg.Wait()
}

// answeringStream is a streaming call that answers each request at once with answer(request).
type answeringStream[Req, Resp any] struct {
	grpc.ClientStream
	ctx     context.Context
	answer  func(*Req) *Resp
	pending chan *Req
}

// answering opens answeringStreams for a shared stream (newOrdered).
func answering[Req, Resp any](answer func(*Req) *Resp) func(context.Context) (grpc.BidiStreamingClient[Req, Resp], error) {
	return func(ctx context.Context) (grpc.BidiStreamingClient[Req, Resp], error) {
		return &answeringStream[Req, Resp]{ctx: ctx, answer: answer, pending: make(chan *Req, 16)}, nil
	}
}

func (s *answeringStream[Req, Resp]) Send(req *Req) error {
	select {
	case s.pending <- req:
		return nil
	case <-s.ctx.Done():
		return io.EOF
	}
}

func (s *answeringStream[Req, Resp]) Recv() (*Resp, error) {
	select {
	case req := <-s.pending:
		return s.answer(req), nil
	case <-s.ctx.Done():
		return nil, status.FromContextError(s.ctx.Err()).Err()
	}
}

func TestSendPutsTheGuardOnTheStreamAndNoneWithoutOne(t *testing.T) {
	sentOut := make(chan *pb.SendRequest, 1)
	c := &Client{sends: newOrdered("send", answering(func(r *pb.SendStreamRequest) *pb.SendStreamResponse {
		sentOut <- r.GetMessage()
		return &pb.SendStreamResponse{MessageId: "7"}
	}))}
	defer c.sends.close()
	for _, tc := range []struct {
		guard *Guard
		want  *pb.WriteGuard
	}{
		{&Guard{Election: "lead", Namespace: "ns", Term: 3}, &pb.WriteGuard{Election: "lead", Namespace: "ns", Term: 3}},
		{&Guard{Election: "lead", Term: 4}, &pb.WriteGuard{Election: "lead", Term: 4}},
		{nil, nil},
	} {
		sent, err := c.Send(context.Background(), SendRequest{
			To: ToPeer("b:1"), ResourceID: "r", EventID: "1", Payload: []byte("x"), Guard: tc.guard,
		})
		if err != nil || sent.MessageID != "7" {
			t.Fatalf("Send with guard %+v: %+v, %v; want message 7", tc.guard, sent, err)
		}
		if m := <-sentOut; !proto.Equal(m.GetGuard(), tc.want) || m.GetResourceId() != "r" {
			t.Errorf("Send with guard %+v put %v on the stream, want guard %v", tc.guard, m, tc.want)
		}
	}
}
