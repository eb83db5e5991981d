// Unit tests of a leader's deadline (leader_until) without a daemon: statuses from a fake stream, the
// states the app is given, how renewals move the deadline of the state the app holds, and when the app is
// demoted by the SDK itself.

package consistd

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// leaderStatus is a LEADER status of holder "me" in term, until the given moment (none when zero).
func leaderStatus(term uint64, until time.Time) *pb.LeadershipStatus {
	s := &pb.LeadershipStatus{
		Election: "e", Namespace: "ns", State: pb.LeadershipState_LEADERSHIP_STATE_LEADER,
		Holder: "me", Term: term, Identity: "me",
	}
	if !until.IsZero() {
		s.LeaderUntil = timestamppb.New(until)
	}
	return s
}

// visible is l without its deadline: what the app can read of a state but LeaderUntil, comparable with ==.
func visible(l Leadership) Leadership {
	l.until = nil
	return l
}

func TestLeaderUntilIsReadAndALapsedLeaderIsUnknown(t *testing.T) {
	now := time.Now()
	until := now.Add(3 * time.Second)
	l := leadershipAt(leaderStatus(4, until), now)
	if l.State != Leader || l.Holder != "me" || l.Term != 4 || !l.LeaderUntil().Equal(until) {
		t.Fatalf("leader until %s: %+v, LeaderUntil %s", until, l, l.LeaderUntil())
	}
	if !l.IsLeader() {
		t.Fatal("a leader whose LeaderUntil is 3 s ahead is not IsLeader")
	}
	if l := leadershipAt(leaderStatus(4, time.Time{}), now); l.State != Leader || !l.LeaderUntil().IsZero() || !l.IsLeader() {
		t.Fatalf("a leader without leader_until (an older daemon): %+v, IsLeader %v", l, l.IsLeader())
	}
	lapsed := leadershipAt(leaderStatus(4, now.Add(-time.Millisecond)), now)
	want := Leadership{State: Unknown, Term: 4, Identity: "me", Election: "e", Namespace: "ns"}
	if visible(lapsed) != want || !lapsed.LeaderUntil().IsZero() {
		t.Fatalf("a leader whose leader_until passed on arrival: %+v, want %+v", lapsed, want)
	}
	follower := &pb.LeadershipStatus{State: pb.LeadershipState_LEADERSHIP_STATE_FOLLOWER, Holder: "other", Term: 5, LeaderUntil: timestamppb.New(until)}
	if l := leadershipAt(follower, now); l.State != Follower || !l.LeaderUntil().IsZero() || l.IsLeader() {
		t.Fatalf("a follower: %+v, LeaderUntil %s", l, l.LeaderUntil())
	}
}

func TestIsLeaderTurnsFalseOnceLeaderUntilHasPassed(t *testing.T) {
	l := Leadership{State: Leader, Holder: "me", Term: 1, until: newDeadline(time.Now().Add(50 * time.Millisecond))}
	if !l.IsLeader() {
		t.Fatal("not IsLeader before LeaderUntil")
	}
	time.Sleep(60 * time.Millisecond)
	if l.IsLeader() {
		t.Fatal("still IsLeader after LeaderUntil")
	}
	if (Leadership{State: Leader, Err: status.Error(codes.Internal, "x")}).IsLeader() {
		t.Fatal("IsLeader with an error")
	}
	if l := (Leadership{State: Leader}); !l.IsLeader() || !l.LeaderUntil().IsZero() {
		t.Fatalf("a Leader without a deadline: IsLeader %v, LeaderUntil %s", l.IsLeader(), l.LeaderUntil())
	}
	if l := (Leadership{State: Follower, until: newDeadline(time.Now().Add(time.Hour))}); l.IsLeader() || !l.LeaderUntil().IsZero() {
		t.Fatalf("a Follower: IsLeader %v, LeaderUntil %s", l.IsLeader(), l.LeaderUntil())
	}
}

func TestCopiesOfALeaderShareItsDeadline(t *testing.T) {
	now := time.Now()
	l := leadershipAt(leaderStatus(1, now.Add(50*time.Millisecond)), now)
	kept := l
	l.until.set(now.Add(time.Hour))
	if !kept.LeaderUntil().Equal(now.Add(time.Hour)) {
		t.Fatalf("a copy's LeaderUntil %s, want the moved %s", kept.LeaderUntil(), now.Add(time.Hour))
	}
	time.Sleep(60 * time.Millisecond)
	if !kept.IsLeader() {
		t.Fatal("a copy is not IsLeader past the first deadline although it was moved on")
	}
}

func TestRenewalsOnlyMoveTheDeadline(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) time.Time { return now.Add(d) }
	st := newStates("e", "ns")
	st.status(leadershipAt(leaderStatus(1, at(time.Second)), now))
	if len(st.queue) != 1 || st.queue[0].State != Leader {
		t.Fatalf("queue after the first LEADER: %+v", st.queue)
	}
	// Renewed before the reader took the first state: the queued state carries the newer deadline.
	st.status(leadershipAt(leaderStatus(1, at(2*time.Second)), now))
	if len(st.queue) != 1 || !st.queue[0].LeaderUntil().Equal(at(2*time.Second)) {
		t.Fatalf("queue after a renewal: %+v", st.queue)
	}
	held := st.queue[0] // what the reader takes
	st.pop()
	st.status(leadershipAt(leaderStatus(1, at(3*time.Second)), now))
	if len(st.queue) != 0 {
		t.Fatalf("a renewal was queued for the reader: %+v", st.queue)
	}
	if d := st.deadline(); !d.Equal(at(3 * time.Second)) {
		t.Fatalf("deadline %s after renewals, want %s", d, at(3*time.Second))
	}
	// The state the reader took follows the renewals it was not sent.
	if d := held.LeaderUntil(); !d.Equal(at(3 * time.Second)) {
		t.Fatalf("the taken LEADER's LeaderUntil %s after renewals, want %s", d, at(3*time.Second))
	}
	if st.expire(at(2 * time.Second)) {
		t.Fatal("expired before the renewed deadline")
	}
	// A new term is news, with a deadline of its own: the state the reader took before keeps its last one.
	st.status(leadershipAt(leaderStatus(2, at(4*time.Second)), now))
	st.status(leadershipAt(leaderStatus(2, at(5*time.Second)), now))
	if len(st.queue) != 1 || st.queue[0].Term != 2 || !st.queue[0].LeaderUntil().Equal(at(5*time.Second)) {
		t.Fatalf("queue after a new term, renewed: %+v", st.queue)
	}
	if d := held.LeaderUntil(); !d.Equal(at(3 * time.Second)) {
		t.Fatalf("the term 1 LEADER's LeaderUntil %s after term 2 was renewed, want its last %s", d, at(3*time.Second))
	}
	// So is a change of state.
	follower := &pb.LeadershipStatus{Election: "e", Namespace: "ns", State: pb.LeadershipState_LEADERSHIP_STATE_FOLLOWER, Holder: "other", Term: 3, Identity: "me"}
	st.status(leadershipAt(follower, now))
	if len(st.queue) != 2 || st.queue[0].Term != 2 || st.queue[1].State != Follower {
		t.Fatalf("queue after a new term and a follower: %+v", st.queue)
	}
	if !st.deadline().IsZero() {
		t.Fatalf("a follower has deadline %s", st.deadline())
	}
	if st.expire(at(time.Hour)) {
		t.Fatal("a follower expired")
	}
	st.status(leadershipAt(follower, now))
	if d := st.queue[0].LeaderUntil(); len(st.queue) != 2 || !d.Equal(at(5*time.Second)) {
		t.Fatalf("queue after the follower again: %+v, term 2 until %s", st.queue, d)
	}
}

func TestTheDeadlinePassingQueuesUnknownOnce(t *testing.T) {
	now := time.Now()
	st := newStates("e", "ns")
	st.status(leadershipAt(leaderStatus(7, now.Add(time.Second)), now))
	st.pop()
	if st.expire(now.Add(999 * time.Millisecond)) {
		t.Fatal("expired before the deadline")
	}
	if !st.expire(now.Add(time.Second)) {
		t.Fatal("not expired at the deadline")
	}
	want := Leadership{State: Unknown, Term: 7, Identity: "me", Election: "e", Namespace: "ns"}
	if len(st.queue) != 1 || visible(st.queue[0]) != want {
		t.Fatalf("queue after the deadline: %+v, want %+v", st.queue, want)
	}
	if st.expire(now.Add(time.Hour)) || len(st.queue) != 1 {
		t.Fatalf("expired twice: %+v", st.queue)
	}
	// The daemon's own late word of the lapse (a LEADER already past) is no news either.
	st.status(leadershipAt(leaderStatus(7, now.Add(time.Second)), now.Add(2*time.Second)))
	if len(st.queue) != 1 {
		t.Fatalf("a lapsed LEADER after the SDK's own UNKNOWN was queued: %+v", st.queue)
	}
	// A later renewal leads again.
	st.status(leadershipAt(leaderStatus(7, now.Add(3*time.Second)), now.Add(2*time.Second)))
	if len(st.queue) != 2 || st.queue[1].State != Leader {
		t.Fatalf("queue after leading again: %+v", st.queue)
	}
}

func TestAReaderFarBehindKeepsTheNewestStates(t *testing.T) {
	st := newStates("e", "ns")
	for term := uint64(1); term <= maxQueued+5; term++ {
		st.status(Leadership{State: Follower, Holder: "other", Term: term})
	}
	if len(st.queue) != maxQueued || st.queue[0].Term != 6 || st.queue[maxQueued-1].Term != maxQueued+5 {
		t.Fatalf("queue of %d from term %d to %d, want %d from 6 to %d", len(st.queue), st.queue[0].Term, st.queue[len(st.queue)-1].Term, maxQueued, maxQueued+5)
	}
}

// fakeElection is an election stream whose statuses the test sends; it stays open (a stopped sidecar says
// nothing) until the test closes it or its context ends.
func fakeElection(statuses <-chan *pb.LeadershipStatus) func(context.Context) (func() (*pb.LeadershipStatus, error), error) {
	return func(ctx context.Context) (func() (*pb.LeadershipStatus, error), error) {
		return func() (*pb.LeadershipStatus, error) {
			select {
			case s, ok := <-statuses:
				if !ok {
					return nil, status.Error(codes.InvalidArgument, "closed by the test")
				}
				return s, nil
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}, nil
	}
}

// nextOf reads the next state, failing if none comes within d.
func nextOf(t *testing.T, states <-chan Leadership, d time.Duration) (Leadership, time.Time) {
	t.Helper()
	select {
	case l := <-states:
		return l, time.Now()
	case <-time.After(d):
		t.Fatalf("no state within %s", d)
		return Leadership{}, time.Time{}
	}
}

// noneWithin fails if a state comes within d.
func noneWithin(t *testing.T, states <-chan Leadership, d time.Duration) {
	t.Helper()
	select {
	case l := <-states:
		t.Fatalf("unexpected state %s holder=%q term=%d until=%s", l.State, l.Holder, l.Term, l.LeaderUntil())
	case <-time.After(d):
	}
}

func TestFollowDemotesTheAppAtLeaderUntilWhenTheSidecarFallsSilent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statuses := make(chan *pb.LeadershipStatus)
	states := (&Client{}).follow(ctx, "e", "ns", fakeElection(statuses))
	const renewDeadline = 500 * time.Millisecond

	first := time.Now().Add(renewDeadline)
	statuses <- leaderStatus(3, first)
	led, _ := nextOf(t, states, time.Second)
	if !led.IsLeader() || led.Term != 3 || !led.LeaderUntil().Equal(first) {
		t.Fatalf("first state %+v until %s, want LEADER in term 3 until %s", led, led.LeaderUntil(), first)
	}
	// While the renewals come, another goroutine keeps asking the LEADER value the app holds whether it
	// leads (as an app would, racing the SDK's renewals).
	var watching sync.WaitGroup
	stopWatching := make(chan struct{})
	var lapsedAt time.Time
	watching.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopWatching:
				return
			case <-tick.C:
				if !led.IsLeader() && lapsedAt.IsZero() {
					lapsedAt = time.Now()
				}
			}
		}
	})
	// Renewals every 100 ms for 1.2 s (over twice the renew deadline): no new state, no demotion, and the
	// held value's deadline follows them.
	var until time.Time
	for range 12 {
		time.Sleep(100 * time.Millisecond)
		until = time.Now().Add(renewDeadline)
		statuses <- leaderStatus(3, until)
	}
	noneWithin(t, states, 100*time.Millisecond)
	close(stopWatching)
	watching.Wait()
	if !lapsedAt.IsZero() {
		t.Fatalf("the held LEADER stopped leading %s after its first LeaderUntil although the sidecar renewed", lapsedAt.Sub(first))
	}
	if !led.IsLeader() || !led.LeaderUntil().Equal(until) {
		t.Fatalf("the held LEADER after renewals: IsLeader %v, LeaderUntil %s, want the last renewal's %s", led.IsLeader(), led.LeaderUntil(), until)
	}
	// The sidecar falls silent: UNKNOWN at the last renewal's deadline, when the held LEADER stops leading.
	l, at := nextOf(t, states, time.Second)
	want := Leadership{State: Unknown, Term: 3, Identity: "me", Election: "e", Namespace: "ns"}
	if visible(l) != want || !l.LeaderUntil().IsZero() {
		t.Fatalf("state after the deadline %+v, want %+v", l, want)
	}
	if late := at.Sub(until); late < 0 || late > 250*time.Millisecond {
		t.Fatalf("UNKNOWN came %s after leader_until, want within 250 ms after it", late)
	}
	if led.IsLeader() || !led.LeaderUntil().Equal(until) {
		t.Fatalf("the held LEADER after UNKNOWN: IsLeader %v, LeaderUntil %s, want false and %s", led.IsLeader(), led.LeaderUntil(), until)
	}
	// The sidecar speaks again: LEADER is delivered as usual, with a deadline of its own; the value held
	// from before keeps its last one.
	statuses <- leaderStatus(3, time.Now().Add(renewDeadline))
	again, _ := nextOf(t, states, time.Second)
	if !again.IsLeader() || again.Term != 3 {
		t.Fatalf("state after renewing again %+v, want LEADER in term 3", again)
	}
	later := time.Now().Add(renewDeadline)
	statuses <- leaderStatus(3, later)
	noneWithin(t, states, 50*time.Millisecond)
	if !again.LeaderUntil().Equal(later) || led.IsLeader() || !led.LeaderUntil().Equal(until) {
		t.Fatalf("after a renewal: new LEADER until %s (want %s), old one IsLeader %v until %s (want false, %s)", again.LeaderUntil(), later, led.IsLeader(), led.LeaderUntil(), until)
	}
}

func TestFollowKeepsTheDeadlineWhileTheReaderIsBusy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	statuses := make(chan *pb.LeadershipStatus)
	states := (&Client{}).follow(ctx, "e", "ns", fakeElection(statuses))

	// Statuses are taken from the stream while the reader takes nothing.
	until := time.Now().Add(500 * time.Millisecond)
	for i := range 3 {
		select {
		case statuses <- leaderStatus(1, until.Add(time.Duration(i)*time.Millisecond)):
		case <-time.After(time.Second):
			t.Fatalf("status %d was not taken from the stream while the reader was busy", i)
		}
	}
	time.Sleep(600 * time.Millisecond)
	// The LEADER the reader had not taken has lapsed; it is followed at once by UNKNOWN.
	l, _ := nextOf(t, states, time.Second)
	if l.State != Leader || l.IsLeader() || !l.LeaderUntil().Equal(until.Add(2*time.Millisecond)) {
		t.Fatalf("first state %+v (IsLeader %v), want the lapsed LEADER with the last renewal's deadline", l, l.IsLeader())
	}
	if l, _ := nextOf(t, states, 100*time.Millisecond); l.State != Unknown || l.Term != 1 {
		t.Fatalf("second state %+v, want UNKNOWN in term 1", l)
	}

	// A LEADER already past on arrival is UNKNOWN, which the reader was already told.
	statuses <- leaderStatus(1, time.Now().Add(-time.Second))
	noneWithin(t, states, 100*time.Millisecond)
}

func TestFollowEndsWithTheDaemonsRefusal(t *testing.T) {
	statuses := make(chan *pb.LeadershipStatus)
	states := (&Client{}).follow(context.Background(), "e", "ns", fakeElection(statuses))
	statuses <- leaderStatus(1, time.Now().Add(time.Hour))
	close(statuses)
	var all []Leadership
	for l := range states {
		all = append(all, l)
	}
	if len(all) != 2 || all[0].State != Leader || all[1].State != Unknown || status.Code(all[1].Err) != codes.InvalidArgument {
		t.Fatalf("states %+v, want LEADER then UNKNOWN with INVALID_ARGUMENT", all)
	}
}

func TestALeadershipGivesTheGuardOfItsElectionAndTerm(t *testing.T) {
	l := Leadership{State: Leader, Term: 7, Election: "e", Namespace: "ns"}
	got := l.Guard()
	if *got != (Guard{Election: "e", Namespace: "ns", Term: 7}) {
		t.Fatalf("Guard() = %+v", *got)
	}
	if p := got.proto(); p.GetElection() != "e" || p.GetNamespace() != "ns" || p.GetTerm() != 7 {
		t.Fatalf("on the wire: %v", p)
	}
}
