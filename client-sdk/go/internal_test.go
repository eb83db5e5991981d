// Unit tests of the pieces that need no daemon: backoff, retry decisions, outcome matching, reasons.

package consistd

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestOnlyUnavailableIsRetried(t *testing.T) {
	if !retryable(status.Error(codes.Unavailable, "restarting")) {
		t.Error("UNAVAILABLE is not retried")
	}
	for _, code := range []codes.Code{codes.InvalidArgument, codes.Canceled, codes.FailedPrecondition, codes.NotFound} {
		if retryable(status.Error(code, "x")) {
			t.Errorf("%s is retried", code)
		}
	}
}

func TestBackoffDoublesUpToTheCapAndResets(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel() // wait returns at once, but still moves to the next pause
	var b backoff
	var seen []time.Duration
	for range 8 {
		b.wait(done)
		seen = append(seen, b.next)
	}
	want := []time.Duration{200, 400, 800, 1600, 3200, 5000, 5000, 5000}
	for i := range want {
		if seen[i] != want[i]*time.Millisecond {
			t.Fatalf("pauses after each wait %v, want %v ms", seen, want)
		}
	}
	b.reset()
	if b.next != backoffInitial {
		t.Fatalf("after reset the pause is %s, want %s", b.next, backoffInitial)
	}
}

func TestAnOutcomeArrivingBeforeSendReturnsIsKeptForIt(t *testing.T) {
	acks := newAckTracker()
	acks.ended, acks.stream = false, 1
	acks.keepEarly("7", Outcome{Kind: Acked, Peer: "p"})

	early := &Sent{MessageID: "7", done: make(chan struct{})}
	acks.await(early, 1)
	if o, err := early.Wait(context.Background()); err != nil || o.Kind != Acked {
		t.Fatalf("outcome %v, %v; want the early ACKED", o, err)
	}
	if len(acks.early) != 0 || len(acks.earlyOrder) != 0 {
		t.Fatalf("early outcomes still kept: %v %v", acks.early, acks.earlyOrder)
	}

	// A send whose outcome stream was replaced meanwhile cannot see its outcome: it fails at once.
	late := &Sent{MessageID: "8", done: make(chan struct{})}
	acks.await(late, 0)
	if _, err := late.Wait(context.Background()); status.Code(err) != codes.Unavailable {
		t.Fatalf("error %v, want UNAVAILABLE", err)
	}
}

func TestEarlyOutcomesAreBounded(t *testing.T) {
	acks := newAckTracker()
	for i := range earlyOutcomes + 10 {
		acks.keepEarly(string(rune('a'+i%26))+strings.Repeat("x", i/26), Outcome{Kind: Acked})
	}
	if len(acks.early) != earlyOutcomes || len(acks.earlyOrder) != earlyOutcomes {
		t.Fatalf("%d early outcomes kept, want %d", len(acks.early), earlyOutcomes)
	}
}

func TestNackReasonsAreCutToTheDaemonsLimitOnARuneBoundary(t *testing.T) {
	long := strings.Repeat("é", maxReason) // 2 bytes each
	cut := truncate(long, maxReason-1)
	if len(cut) > maxReason-1 || !utf8.ValidString(cut) || len(cut) < maxReason-2 {
		t.Fatalf("cut to %d bytes (valid UTF-8: %v)", len(cut), utf8.ValidString(cut))
	}
	if truncate("short", maxReason) != "short" {
		t.Fatal("a short reason was changed")
	}
}
