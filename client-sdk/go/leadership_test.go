// Tests of campaigning: leading, following, handover on resignation, UNKNOWN when the daemon is lost, and
// UNKNOWN at leader_until when the daemon is stopped.

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

func TestCampaignDemotesTheAppAtLeaderUntilWhenTheDaemonIsStopped(t *testing.T) {
	d := startDaemon(t, "sdk-go-until")
	c := ready(t, d.Socket)
	election := unique("go-until")
	timing := consistd.Timing{LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: time.Second}
	ctx, stop := context.WithCancel(testContext(t))
	defer stop()
	states := c.Campaign(ctx, election, consistd.WithTiming(timing))

	led := nextState(t, states, "leading", func(s consistd.Leadership) bool { return s.IsLeader() })
	first := led.LeaderUntil()
	if first.IsZero() || first.After(time.Now().Add(timing.RenewDeadline)) {
		t.Fatalf("LEADER with LeaderUntil %s, want one within the renew deadline (%s) from now", first, timing.RenewDeadline)
	}

	// The daemon renews every second, sending a status with a later leader_until each time; the app is
	// given no new state, and the LEADER value it holds follows the renewals: still leading past the
	// LeaderUntil it was sent with.
	quiet := time.Until(first) + 500*time.Millisecond
	select {
	case s := <-states:
		t.Fatalf("a state while the daemon renewed: %s holder=%q term=%d until=%s", s.State, s.Holder, s.Term, s.LeaderUntil())
	case <-time.After(quiet):
	}
	if !led.IsLeader() {
		t.Fatalf("the LEADER value is not IsLeader %s after it was sent (LeaderUntil %s, first %s) although the daemon renewed", quiet, led.LeaderUntil(), first)
	}
	if held := led.LeaderUntil(); !held.After(first.Add(timing.RetryPeriod)) {
		t.Fatalf("the LEADER value's LeaderUntil %s after %s of renewals, want later than the first %s by over a retry period", held, quiet, first)
	}
	// It is the daemon's own leader_until, give or take the renewal in flight.
	now, err := c.GetLeadership(ctx, election)
	if err != nil {
		t.Fatalf("GetLeadership: %v", err)
	}
	if !now.IsLeader() || now.Term != led.Term || now.LeaderUntil().Sub(led.LeaderUntil()).Abs() > timing.RetryPeriod+500*time.Millisecond {
		t.Fatalf("GetLeadership: %s term %d until %s, want LEADER in term %d until about %s", now.State, now.Term, now.LeaderUntil(), led.Term, led.LeaderUntil())
	}

	// Stop the daemon just after a renewal reached the SDK (leader_until moves by about a retry period),
	// so no other renewal is on its way.
	before := led.LeaderUntil()
	for led.LeaderUntil().Sub(before) < timing.RetryPeriod/2 {
		if time.Now().After(before) {
			t.Fatalf("no renewal moved LeaderUntil %s before it passed", before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(d.resume) // before the daemon's own cleanup stops it
	d.pause()
	stopped := time.Now()
	time.Sleep(200 * time.Millisecond) // anything already sent arrives
	until := led.LeaderUntil()
	t.Logf("stopped the daemon %s before leader_until %s", until.Sub(stopped).Round(time.Millisecond), until.Format(time.RFC3339Nano))
	if !led.IsLeader() {
		t.Fatalf("the LEADER value is not IsLeader right after the daemon was stopped (LeaderUntil %s)", until)
	}

	// Nothing can come from the stopped daemon: the SDK demotes the app by itself at leader_until, and the
	// LEADER value it holds stops leading.
	const early, late = 100 * time.Millisecond, 1500 * time.Millisecond
	select {
	case s := <-states:
		at := time.Now()
		t.Logf("after stopping the daemon: %s holder=%q term=%d, %s after leader_until", s.State, s.Holder, s.Term, at.Sub(until).Round(time.Millisecond))
		if s.IsLeader() || s.State != consistd.Unknown || s.Holder != "" || s.Term != led.Term || s.Err != nil {
			t.Fatalf("state after leader_until: %s holder=%q term=%d error %v, want UNKNOWN without holder in term %d", s.State, s.Holder, s.Term, s.Err, led.Term)
		}
		if at.Before(until.Add(-early)) || at.After(until.Add(late)) {
			t.Fatalf("UNKNOWN came %s after leader_until, want from -%s to %s", at.Sub(until), early, late)
		}
	case <-time.After(time.Until(until) + 5*time.Second):
		t.Fatalf("no state within 5s after leader_until %s with the daemon stopped", until.Format(time.RFC3339Nano))
	}
	if led.IsLeader() || !led.LeaderUntil().Equal(until) {
		t.Fatalf("the held LEADER value after UNKNOWN: IsLeader %v until %s, want false until %s", led.IsLeader(), led.LeaderUntil(), until)
	}

	// Running again, the daemon renews (or takes the Lease again) and the app leads again, with a new
	// value; the one held from before keeps its last deadline.
	d.resume()
	again := nextState(t, states, "leading again", func(s consistd.Leadership) bool { return s.IsLeader() })
	if !again.LeaderUntil().After(until) {
		t.Fatalf("leading again until %s, want later than %s", again.LeaderUntil(), until)
	}
	if led.IsLeader() || !led.LeaderUntil().Equal(until) {
		t.Fatalf("the LEADER value from before the stop leads again (until %s, was %s)", led.LeaderUntil(), until)
	}
}
