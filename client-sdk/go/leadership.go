// Leadership as a channel of states: campaign while a context lives, or observe without taking part.

package consistd

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// State is this sidecar's view of an election.
type State int32

const (
	// Leader: this sidecar holds the Lease and renewed it in time; the only state to act as leader in.
	Leader = State(pb.LeadershipState_LEADERSHIP_STATE_LEADER)
	// Follower: another candidate holds a live Lease.
	Follower = State(pb.LeadershipState_LEADERSHIP_STATE_FOLLOWER)
	// Unknown: the apiserver or the sidecar cannot be reached, or no leader is decided yet.
	Unknown = State(pb.LeadershipState_LEADERSHIP_STATE_UNKNOWN)
)

// String gives the protocol's name without its prefix: "LEADER", "FOLLOWER", "UNKNOWN".
func (s State) String() string {
	return strings.TrimPrefix(pb.LeadershipState(s).String(), "LEADERSHIP_STATE_")
}

// Leadership is one observation of an election.
//
// Copying a Leadership is cheap and safe from any goroutine. While it is a Leader state from a Campaign or
// Observe channel, every copy shares one deadline (LeaderUntil) with the channel, which moves it on each
// renewal of the Lease. Compare states by their fields (State, Holder, Term, ...), not with ==: == also
// compares which deadline a state shares, so two Leader states read from different statuses differ even
// when their fields agree.
type Leadership struct {
	// State is Leader, Follower or Unknown.
	State State
	// Holder is the current holder's identity; empty when nobody holds the Lease.
	Holder string
	// Term is the fencing term: 1 for an election's first leader, higher on every change of holder; 0 only
	// in an Unknown state before any Lease was read. Pass it in a write's or a send's Guard.
	Term uint64
	// Identity is this sidecar's identity in the election.
	Identity string
	// Election is the election's name (the Lease's name).
	Election string
	// Namespace is the Lease's namespace.
	Namespace string
	// Err is set only on the last value of a Campaign or Observe channel, when the daemon refused the
	// election with an error reconnecting cannot mend (a gRPC status, e.g. INVALID_ARGUMENT).
	Err error

	// until is a Leader state's deadline (nil in other states), shared by every copy of the state and by
	// the channel that sent it.
	until *deadline
}

// deadline is a Leader state's LeaderUntil, which the follow loop moves on each renewal while the app
// reads it from its copies of the state.
type deadline struct {
	mu sync.Mutex
	t  time.Time
}

func newDeadline(t time.Time) *deadline { return &deadline{t: t} }

// get is the deadline; zero for a nil deadline or one never set.
func (d *deadline) get() time.Time {
	if d == nil {
		return time.Time{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.t = t
}

// Guard is the guard of this election and term, for a write (WithGuard) or a send (SendRequest.Guard): it
// goes only while this term lasts, and whatever checks it later refuses it once a later term has acted there.
func (l Leadership) Guard() *Guard {
	return &Guard{Election: l.Election, Namespace: l.Namespace, Term: l.Term}
}

// LeaderUntil is, in a Leader state, the moment (on this node's clock, which the sidecar shares) until
// which the sidecar says Leader without renewing the Lease again: its last renewal plus the renew
// deadline. It is zero in other states, and from daemons that do not send it.
//
// Renewals are not sent on a Campaign or Observe channel as new values: each one moves this deadline on,
// in the value the app holds (and every copy of it) too. If it passes with no renewal (the sidecar is
// stopped or cut off) the channel sends Unknown at that moment. Once the channel has sent a different
// state (another holder or term, Unknown, or the channel ended), a value kept from before keeps the last
// deadline it had and stops leading when that passes. A value from GetLeadership keeps the deadline it
// was read with.
func (l Leadership) LeaderUntil() time.Time {
	if l.State != Leader {
		return time.Time{}
	}
	return l.until.get()
}

// IsLeader reports whether this sidecar leads now: the only state in which the app may act as leader. It
// is false once LeaderUntil has passed, even before the channel has sent the Unknown that follows; since
// renewals move LeaderUntil in the value the app holds, a Leader value kept from a Campaign channel stays
// leader for as long as the sidecar renews and nothing else was sent. Stop acting as leader on the first
// value from the channel that is not leader.
func (l Leadership) IsLeader() bool {
	if l.State != Leader || l.Err != nil {
		return false
	}
	until := l.LeaderUntil()
	return until.IsZero() || time.Now().Before(until)
}

// leadershipAt is the state a status from the daemon gives at now: a Leader state (with a deadline of its
// own) unless its LeaderUntil has already passed, in which case it is not leading and becomes Unknown
// (nobody as holder, same term).
func leadershipAt(s *pb.LeadershipStatus, now time.Time) Leadership {
	l := Leadership{
		State: State(s.GetState()), Holder: s.GetHolder(), Term: s.GetTerm(),
		Identity: s.GetIdentity(), Election: s.GetElection(), Namespace: s.GetNamespace(),
	}
	if l.State != Leader {
		return l
	}
	var until time.Time
	if u := s.GetLeaderUntil(); u != nil {
		until = u.AsTime()
	}
	if !until.IsZero() && !now.Before(until) {
		return unknownAfter(l)
	}
	l.until = newDeadline(until)
	return l
}

// unknownAfter is the Unknown state that tells an app following l that it may no longer lead.
func unknownAfter(l Leadership) Leadership {
	return Leadership{State: Unknown, Term: l.Term, Identity: l.Identity, Election: l.Election, Namespace: l.Namespace}
}

// Timing is an election's timing; zero fields take the daemon's defaults (client-go's: 15 s, 10 s, 2 s).
type Timing struct {
	// LeaseDuration is how long a Lease stays valid after its last renewal.
	LeaseDuration time.Duration
	// RenewDeadline is how long a leader may fail to renew before it stops reporting Leader.
	RenewDeadline time.Duration
	// RetryPeriod is how often candidates try to acquire and leaders renew.
	RetryPeriod time.Duration
}

// ElectionOption tunes Campaign, Observe or GetLeadership.
type ElectionOption func(*electionOptions)

type electionOptions struct {
	namespace string
	identity  string
	timing    *pb.LeaseTiming
}

// InNamespace puts the election's Lease in namespace instead of the daemon's own.
func InNamespace(namespace string) ElectionOption {
	return func(o *electionOptions) { o.namespace = namespace }
}

// AsIdentity campaigns under this identity instead of the daemon's (Campaign only).
func AsIdentity(identity string) ElectionOption {
	return func(o *electionOptions) { o.identity = identity }
}

// WithTiming sets the election's timing (Campaign only).
func WithTiming(t Timing) ElectionOption {
	d := func(d time.Duration) *durationpb.Duration {
		if d == 0 {
			return nil
		}
		return durationpb.New(d)
	}
	return func(o *electionOptions) {
		o.timing = &pb.LeaseTiming{LeaseDuration: d(t.LeaseDuration), RenewDeadline: d(t.RenewDeadline), RetryPeriod: d(t.RetryPeriod)}
	}
}

func electionOpts(opts []ElectionOption) electionOptions {
	var o electionOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Campaign makes this sidecar a candidate in election until ctx ends, and sends its view on the
// returned channel: the current state first, then every change, in order (keep reading it: the next
// state waits for the reader; if it falls far behind, the oldest states it has not taken are dropped, the
// last one is always current). When ctx ends the stream closes, the daemon resigns at once and the
// channel is closed.
//
// While this sidecar leads, each renewal of the Lease moves the deadline (Leadership.LeaderUntil) on
// without a new value, in the Leader value the app was sent too. If the deadline passes with no newer
// word from the sidecar (it is stopped or cut off from the apiserver), the channel gets Unknown at that
// moment: stop acting as leader. If the connection to the sidecar is lost the channel gets Unknown at
// once and the campaign starts again with backoff. If the daemon refuses the campaign, the last value
// carries the error in Err and the channel is closed.
func (c *Client) Campaign(ctx context.Context, election string, opts ...ElectionOption) <-chan Leadership {
	o := electionOpts(opts)
	req := &pb.CampaignRequest{Election: election, Namespace: o.namespace, Identity: o.identity, Timing: o.timing}
	return c.follow(ctx, election, o.namespace, func(ctx context.Context) (func() (*pb.LeadershipStatus, error), error) {
		stream, err := c.leadership.Campaign(ctx, req)
		if err != nil {
			return nil, err
		}
		return func() (*pb.LeadershipStatus, error) {
			r, err := stream.Recv()
			return r.GetStatus(), err
		}, nil
	})
}

// Observe sends an election's state on the returned channel without taking part, until ctx ends; it
// behaves like Campaign's channel.
func (c *Client) Observe(ctx context.Context, election string, opts ...ElectionOption) <-chan Leadership {
	o := electionOpts(opts)
	req := &pb.ObserveRequest{Election: election, Namespace: o.namespace}
	return c.follow(ctx, election, o.namespace, func(ctx context.Context) (func() (*pb.LeadershipStatus, error), error) {
		stream, err := c.leadership.Observe(ctx, req)
		if err != nil {
			return nil, err
		}
		return func() (*pb.LeadershipStatus, error) {
			r, err := stream.Recv()
			return r.GetStatus(), err
		}, nil
	})
}

// GetLeadership answers an election's current state at once (Unknown if it says Leader with a LeaderUntil
// already past). Nothing moves the LeaderUntil of the value it returns: it stops leading at the deadline
// it was read with.
func (c *Client) GetLeadership(ctx context.Context, election string, opts ...ElectionOption) (Leadership, error) {
	o := electionOpts(opts)
	r, err := c.leadership.GetLeadership(ctx, &pb.GetLeadershipRequest{Election: election, Namespace: o.namespace})
	if err != nil {
		return Leadership{}, err
	}
	return leadershipAt(r.GetStatus(), time.Now()), nil
}

// maxQueued is how many states follow keeps for a reader that has not taken them; past it the oldest go.
const maxQueued = 16

// states is what follow has to tell the app: the states it has not taken yet, in order, and the newest
// state it has been or will be given, whose deadline (shared with the app's copies) renewals move.
type states struct {
	queue []Leadership
	// latest is the newest state queued (taken or not; the last in queue if any); told is false until one
	// was.
	latest Leadership
	told   bool
}

func newStates(election, namespace string) *states {
	return &states{latest: Leadership{State: Unknown, Election: election, Namespace: namespace}}
}

func (s *states) push(l Leadership) {
	if len(s.queue) == maxQueued {
		s.queue = append(s.queue[:0], s.queue[1:]...)
	}
	s.queue = append(s.queue, l)
	s.latest, s.told = l, true
}

// pop removes the state the reader took (the first).
func (s *states) pop() {
	s.queue[0] = Leadership{}
	s.queue = s.queue[1:]
}

// status takes a state the daemon sent (leadershipAt's). One with the state, holder and term of the
// latest is a renewal (or a reconnected stream's first message): nothing is queued, it only moves the
// latest state's deadline, which the app's copies of it share (and the queued one if not taken yet).
func (s *states) status(l Leadership) {
	if s.told && l.State == s.latest.State && l.Holder == s.latest.Holder && l.Term == s.latest.Term {
		if s.latest.until != nil {
			s.latest.until.set(l.until.get())
		}
		return
	}
	s.push(l)
}

// deadline is when the latest state stops leading: its LeaderUntil while it is Leader, else zero.
func (s *states) deadline() time.Time { return s.latest.LeaderUntil() }

// expire queues Unknown if the deadline has passed at now, with no newer status; it reports whether it did.
func (s *states) expire(now time.Time) bool {
	if d := s.deadline(); d.IsZero() || now.Before(d) {
		return false
	}
	s.push(unknownAfter(s.latest))
	return true
}

// lost queues Unknown after the connection to the sidecar was lost, unless the latest state says so.
func (s *states) lost() {
	if !s.told || s.latest.State != Unknown {
		s.push(unknownAfter(s.latest))
	}
}

// refused queues the last state, Unknown with the daemon's error.
func (s *states) refused(err error) {
	l := unknownAfter(s.latest)
	l.Err = err
	s.push(l)
}

// receive opens one election stream and passes its statuses on until it ends, then its error on ended.
func receive(ctx context.Context, open func(context.Context) (func() (*pb.LeadershipStatus, error), error), statuses chan<- *pb.LeadershipStatus, ended chan<- error) {
	recv, err := open(ctx)
	if err != nil {
		ended <- err
		return
	}
	for {
		s, err := recv()
		if err != nil {
			ended <- streamEnded(err, "election")
			return
		}
		if s == nil {
			continue
		}
		select {
		case statuses <- s:
		case <-ctx.Done():
			ended <- ctx.Err()
			return
		}
	}
}

// follow runs one election stream opened by open, reopening it with backoff when the sidecar is lost,
// and sends each state on the returned channel until ctx ends. It never waits for the reader to take
// statuses from the stream, so a Leader state's deadline is kept even while the sidecar says nothing.
func (c *Client) follow(ctx context.Context, election, namespace string, open func(context.Context) (func() (*pb.LeadershipStatus, error), error)) <-chan Leadership {
	out := make(chan Leadership)
	go func() {
		defer close(out)
		st := newStates(election, namespace)
		var pause backoff
		deadline := time.NewTimer(time.Hour)
		deadline.Stop()
		defer deadline.Stop()
		// run gives the reader its states, takes statuses and keeps the deadline until the stream ends
		// (its error), the pause ends (nil) or ctx ends (ctx.Err()); a nil channel is never ready.
		run := func(statuses <-chan *pb.LeadershipStatus, ended <-chan error, paused <-chan time.Time) error {
			for {
				if d := st.deadline(); d.IsZero() {
					deadline.Stop()
				} else {
					deadline.Reset(time.Until(d))
				}
				var send chan<- Leadership
				var next Leadership
				if len(st.queue) > 0 {
					send, next = out, st.queue[0]
				}
				select {
				case send <- next:
					st.pop()
				case s := <-statuses:
					pause.reset()
					st.status(leadershipAt(s, time.Now()))
				case <-deadline.C:
					st.expire(time.Now())
				case err := <-ended:
					return err
				case <-paused:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		for {
			streamCtx, cancel := context.WithCancel(ctx)
			statuses, ended := make(chan *pb.LeadershipStatus), make(chan error, 1)
			go receive(streamCtx, open, statuses, ended)
			err := run(statuses, ended, nil)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if !retryable(err) {
				st.refused(err)
				for len(st.queue) > 0 {
					select {
					case out <- st.queue[0]:
						st.pop()
					case <-ctx.Done():
						return
					}
				}
				return
			}
			// Tell the app at once that it may no longer lead, then try again.
			st.lost()
			wait := time.NewTimer(pause.step())
			run(nil, nil, wait.C)
			wait.Stop()
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return out
}
