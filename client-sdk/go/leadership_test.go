// Tests of campaigning: leading, following, handover on resignation, UNKNOWN when the daemon is lost.

package consistd_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func TestCampaignLeadsFollowsAndHandsOverWhenTheLeaderStops(t *testing.T) {
	a := ready(t, "")
	b := ready(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	election := unique("go-lead")

	ctxA, stopA := context.WithCancel(testContext(t))
	defer stopA()
	statesA := a.Campaign(ctxA, election)
	led := nextState(t, statesA, "a leading", func(s consistd.Leadership) bool { return s.IsLeader() })
	// The term of a new election's first leader is 1 (the new Lease's leaseTransitions + 1); every later
	// holder's term is higher, checked below.
	if led.Holder != "sdk-a" || led.Identity != "sdk-a" || led.Election != election {
		t.Fatalf("a leads with holder %q identity %q election %q, want sdk-a, sdk-a, %s", led.Holder, led.Identity, led.Election, election)
	}

	statesB := b.Campaign(testContext(t), election)
	follower := nextState(t, statesB, "b following", func(s consistd.Leadership) bool { return s.State == consistd.Follower })
	if follower.Holder != "sdk-a" || follower.Term != led.Term {
		t.Fatalf("b follows holder %q term %d, want sdk-a in term %d", follower.Holder, follower.Term, led.Term)
	}

	start := time.Now()
	stopA()
	for range statesA {
	}
	took := nextState(t, statesB, "b leading", func(s consistd.Leadership) bool { return s.IsLeader() })
	if took.Holder != "sdk-b" || took.Term <= led.Term {
		t.Fatalf("b leads with holder %q term %d, want sdk-b after term %d", took.Holder, took.Term, led.Term)
	}
	t.Logf("b led %s after a stopped", time.Since(start).Round(time.Millisecond))
}

func TestCampaignReportsUnknownAtOnceWhenTheDaemonIsLostThenCampaignsAgain(t *testing.T) {
	p := startProxy(t, env(t, "CONSISTD_SOCKET"))
	c := ready(t, p.Socket)
	states := c.Campaign(testContext(t), unique("go-lost"))
	nextState(t, states, "leading", func(s consistd.Leadership) bool { return s.IsLeader() })

	p.down()
	select {
	case s := <-states:
		if s.State != consistd.Unknown || s.Err != nil {
			t.Fatalf("after losing the daemon: %s (error %v), want UNKNOWN", s.State, s.Err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no UNKNOWN within 2s of losing the daemon")
	}
	p.up()
	nextState(t, states, "leading again", func(s consistd.Leadership) bool { return s.IsLeader() })
}

func TestCampaignForAnInvalidElectionEndsWithTheDaemonsError(t *testing.T) {
	c := ready(t, "")
	states := c.Campaign(testContext(t), "Not A Valid Lease Name!")
	var last consistd.Leadership
	for s := range states {
		last = s
	}
	if status.Code(last.Err) != codes.InvalidArgument || last.IsLeader() {
		t.Fatalf("last state %s with error %v, want the daemon's INVALID_ARGUMENT", last.State, last.Err)
	}
}
