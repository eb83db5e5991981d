// Leadership as a channel of states: campaign while a context lives, or observe without taking part.

package consistd

import (
	"context"
	"strings"
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
type Leadership struct {
	// State is Leader, Follower or Unknown.
	State State
	// Holder is the current holder's identity; empty when nobody holds the Lease.
	Holder string
	// Term is the fencing term: 1 for an election's first leader, higher on every change of holder; 0 only
	// in an Unknown state before any Lease was read. Pass it in a write's Guard.
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
}

// IsLeader reports whether this sidecar leads: the only state in which the app may act as leader.
func (l Leadership) IsLeader() bool { return l.State == Leader && l.Err == nil }

func leadershipFrom(s *pb.LeadershipStatus) Leadership {
	return Leadership{
		State: State(s.GetState()), Holder: s.GetHolder(), Term: s.GetTerm(),
		Identity: s.GetIdentity(), Election: s.GetElection(), Namespace: s.GetNamespace(),
	}
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
// state waits for the reader). When ctx ends the stream closes, the daemon resigns at once and the
// channel is closed.
//
// If the connection to the sidecar is lost the channel gets Unknown at once (stop acting as leader) and
// the campaign starts again with backoff. If the daemon refuses the campaign, the last value carries the
// error in Err and the channel is closed.
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

// GetLeadership answers an election's current state at once.
func (c *Client) GetLeadership(ctx context.Context, election string, opts ...ElectionOption) (Leadership, error) {
	o := electionOpts(opts)
	r, err := c.leadership.GetLeadership(ctx, &pb.GetLeadershipRequest{Election: election, Namespace: o.namespace})
	if err != nil {
		return Leadership{}, err
	}
	return leadershipFrom(r.GetStatus()), nil
}

// follow runs one election stream opened by open, reopening it with backoff when the sidecar is lost,
// and sends each state on the returned channel until ctx ends.
func (c *Client) follow(ctx context.Context, election, namespace string, open func(context.Context) (func() (*pb.LeadershipStatus, error), error)) <-chan Leadership {
	out := make(chan Leadership)
	go func() {
		defer close(out)
		send := func(l Leadership) bool {
			select {
			case out <- l:
				return true
			case <-ctx.Done():
				return false
			}
		}
		last := Leadership{State: Unknown, Election: election, Namespace: namespace}
		sent := false // whether last has been sent
		var pause backoff
		for {
			err := func() error {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				recv, err := open(ctx)
				if err != nil {
					return err
				}
				for {
					s, err := recv()
					if err != nil {
						return streamEnded(err, "election")
					}
					if s == nil {
						continue
					}
					pause.reset()
					last, sent = leadershipFrom(s), true
					if !send(last) {
						return ctx.Err()
					}
				}
			}()
			if ctx.Err() != nil {
				return
			}
			unknown := Leadership{State: Unknown, Term: last.Term, Identity: last.Identity, Election: election, Namespace: last.Namespace}
			if !retryable(err) {
				unknown.Err = err
				send(unknown)
				return
			}
			// Tell the app at once that it may no longer lead, then try again.
			if !sent || last.State != Unknown {
				last, sent = unknown, true
				if !send(last) {
					return
				}
			}
			if !pause.wait(ctx) {
				return
			}
		}
	}()
	return out
}
