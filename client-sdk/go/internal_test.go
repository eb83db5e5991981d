// Unit tests of the pieces that need no daemon: backoff, retry decisions, reasons.

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
