// A reconciler on the sidecar's work queue (ReconcileService.Reconcile), shaped like controller-runtime's:
// a Reconciler gets one item (key) at a time per key, and how it returns is the lease's completion.

package consistd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

const (
	// maxCompletionError is the longest error text a completion may carry, in bytes (the daemon's limit).
	maxCompletionError = 4096
	// minRequeueAfter and maxRequeueAfter bound a REQUEUE's delay as the daemon accepts it.
	minRequeueAfter = time.Millisecond
	maxRequeueAfter = 24 * time.Hour
)

// Reconciler handles one work item: the key (namespace/name of a primary object) that needs work. How it
// returns ends the item's lease:
//
//   - Result{} and a nil error: done (OUTCOME_DONE); the key comes again when its object (or a related
//     one) changes, once however many changes arrive meanwhile.
//   - Result{RequeueAfter: d}, d > 0, and a nil error: the key comes again after d, sooner if it changes
//     (OUTCOME_REQUEUE).
//   - a non-nil error: it failed; the key comes again after its backoff with Item.Attempt one higher and
//     Item.LastError set to err.Error() (OUTCOME_RETRY). The Result is then ignored, as in
//     controller-runtime.
//   - an error wrapping TerminalError(...): it failed and retrying cannot help; the key waits until its
//     object or a related one changes (OUTCOME_TERMINAL).
//
// A panic is recovered, logged with its stack and taken as an error "panic: ... [recovered]".
type Reconciler interface {
	Reconcile(ctx context.Context, item Item) (Result, error)
}

// ReconcilerFunc is a function that is a Reconciler.
type ReconcilerFunc func(ctx context.Context, item Item) (Result, error)

// Reconcile calls f.
func (f ReconcilerFunc) Reconcile(ctx context.Context, item Item) (Result, error) {
	return f(ctx, item)
}

// Result is what a successful Reconcile asks for, as controller-runtime's reconcile.Result.
type Result struct {
	// RequeueAfter, when more than 0, hands the key out again after this long (sooner if its object
	// changes). It is sent as at least 1 ms and at most 24 h, the daemon's bounds.
	RequeueAfter time.Duration
	// Priority is that of the pass this queues (the requeue, or one for a change during the pass):
	// a higher one is handed out first, as controller-runtime 0.23's Result.Priority. Default 0.
	Priority int32
}

// terminalError marks a Reconciler's error as one retrying cannot mend.
type terminalError struct{ err error }

func (e *terminalError) Error() string {
	if e.err == nil {
		return "nil terminal error"
	}
	return "terminal error: " + e.err.Error()
}

func (e *terminalError) Unwrap() error { return e.err }

// Is makes errors.Is(err, TerminalError(nil)) report whether err wraps any TerminalError.
func (e *terminalError) Is(target error) bool {
	_, ok := target.(*terminalError)
	return ok
}

// TerminalError wraps err so that a Reconciler returning it (or an error wrapping it) ends the lease as
// OUTCOME_TERMINAL: no retry until the key's object, or a related one, changes. As controller-runtime's
// reconcile.TerminalError: errors.Is(err, consistd.TerminalError(nil)) tells whether an error is one, and
// its text is "terminal error: " followed by err's.
func TerminalError(err error) error { return &terminalError{err: err} }

// ReconcileSpec is the work queue to reconcile: which objects are the keys, which other objects queue
// them, and how the work is handed out. Streams that give the same Name share one queue in the sidecar
// (their specs must be equal), so two processes of a pod never work on one key at once.
type ReconcileSpec struct {
	// Name is the queue's name: a DNS label (lowercase letters, digits, '-'), the `name` label of its
	// metrics and the name `consistd status` shows.
	Name string
	// Resource is the primary resource, in any form Watch accepts ("configmaps", "apps/v1/deployments",
	// "Deployment"); each of its objects is one key, namespace/name.
	Resource string
	// Namespace of the primary objects; empty for all namespaces (or a cluster-scoped resource).
	Namespace string
	// LabelSelector and FieldSelector narrow the primary objects (Kubernetes selectors; empty for none).
	LabelSelector string
	FieldSelector string
	// View is how much of each primary object the queue's watch keeps and hands out (Item.Object); the
	// zero View is the whole object without metadata.managedFields.
	View View
	// Changes names the parts of a primary object whose change queues a pass, as controller-runtime's
	// GenerationChangedPredicate and its label and annotation predicates: any part named will do, and an
	// object's first state, its deletion and its deletionTimestamp being set always queue one. The zero
	// Changes names none: every change queues a pass.
	Changes Changes
	// Related are other objects whose changes queue the primary they name.
	Related []Related
	// MaxLeases is how many keys are reconciled at once, as controller-runtime's MaxConcurrentReconciles;
	// 0 means 1. At most 10000.
	MaxLeases int
	// Retry sets the delays of failed passes; zero fields take client-go's defaults.
	Retry RetryPolicy
	// LeaseTimeout is how long one pass may take: after it the lease goes back to the queue and the
	// pass's ctx is cancelled. 0 means the daemon's default, 10 minutes; at least 1 second.
	LeaseTimeout time.Duration
	// Election, when set, hands out work only while this sidecar leads that election; each item then
	// carries the term (Item.Term, and the guard ForItem adds to writes). ElectionNamespace is its Lease's
	// namespace; empty means the sidecar's own. With Sharded, the election names the group whose members
	// share the keys instead.
	Election          string
	ElectionNamespace string
	// Sharded spreads the keys over every pod whose sidecar runs this queue (the same Name and spec) under
	// Election: a key is leased to one pod at a time across the whole group. It needs Election (without one
	// the sidecar refuses the spec, INVALID_ARGUMENT naming spec.sharded). Each item's Term is then the
	// epoch of the key's slot, and the guard ForItem adds works unchanged.
	Sharded bool
	// ShardBy is what a Sharded queue hashes a key by to find its slot: the zero ShardBy (as ShardByKey)
	// hashes the key, namespace and name; ShardByNamespace hashes its namespace, so that each member lists
	// and watches only its slots' namespaces (for a primary of a namespaced resource in all namespaces
	// only). It needs Sharded (without it the sidecar refuses the spec, INVALID_ARGUMENT naming
	// spec.shard_by).
	ShardBy ShardBy
	// Finalizer is a finalizer the queue keeps on its primary objects (a qualified name,
	// "example.com/cleanup"; empty for none), as controller-runtime's controllerutil does: the sidecar adds
	// it before an object's first pass, and hands out an object being deleted that carries it as a finalize
	// pass (Item.Finalizing). A pass returning Result{} and a nil error (DONE) removes it, any other outcome
	// keeps it, and a deposed leader's removal is refused; a name without a prefix ("domain/name") is
	// refused, INVALID_ARGUMENT naming spec.finalizer.
	Finalizer string
}

// ShardBy is what a Sharded queue hashes a key by to find its slot (ReconcileSpec.ShardBy). The zero
// ShardBy is ShardByKey's.
type ShardBy int32

const (
	// ShardByKey hashes the key, namespace and name: keys spread evenly over the slots, and every member
	// watches every object.
	ShardByKey = ShardBy(pb.ShardBy_SHARD_BY_KEY)
	// ShardByNamespace hashes the key's namespace, as Kubernetes' sharded list and watch (KEP-5866) hashes
	// object.metadata.namespace: a namespace's keys are owned together, and each member lists and watches
	// only the namespaces of its slots (where the apiserver honours shard selectors; elsewhere the sidecar
	// drops the rest itself). Only for a primary of a namespaced resource in all namespaces (the sidecar
	// refuses the spec otherwise, INVALID_ARGUMENT naming spec.shard_by); related queries are watched whole.
	ShardByNamespace = ShardBy(pb.ShardBy_SHARD_BY_NAMESPACE)
)

// String gives the protocol's name without its prefix: "KEY", "NAMESPACE" ("UNSPECIFIED" for the zero
// ShardBy).
func (s ShardBy) String() string {
	return strings.TrimPrefix(pb.ShardBy(s).String(), "SHARD_BY_")
}

// Changes names parts of an object (ReconcileSpec.Changes, Related.Changes): only a change of one of them
// queues a pass. The zero Changes names none and sends no filter, so every change queues one.
type Changes struct {
	// Generation is metadata.generation, which the apiserver moves on a change of the spec (for most
	// resources, and custom resources with a status subresource), not on one of status or metadata alone:
	// a status write then queues nothing. An object without a generation (a ConfigMap, a Secret) counts
	// every change.
	Generation bool
	// Labels is metadata.labels.
	Labels bool
	// Annotations is metadata.annotations.
	Annotations bool
}

// proto is the filter as sent: nil for the zero Changes, which leaves ObjectQuery.changes unset (every
// change), never an empty filter (the daemon refuses one).
func (c Changes) proto() *pb.ChangeFilter {
	if c == (Changes{}) {
		return nil
	}
	return &pb.ChangeFilter{Generation: c.Generation, Labels: c.Labels, Annotations: c.Annotations}
}

// Related is a query whose objects name a primary key: a change to such an object queues that key. Set
// exactly one of ControllerOwner, Label, Annotation and Field. A value "name" names the primary in the
// related object's own namespace; "namespace/name" names it anywhere.
type Related struct {
	// Resource, Namespace, LabelSelector and FieldSelector are the related objects, as for the primary.
	Resource      string
	Namespace     string
	LabelSelector string
	FieldSelector string
	// View is how much of each related object the queue's watch keeps. A projection (View.Fields) also
	// keeps what the mapping reads; a MetadataOnly view can map by ControllerOwner, Label, Annotation, or
	// a Field under metadata.
	View View
	// Changes names the parts of a related object whose change queues its primary, as ReconcileSpec.Changes
	// (the zero Changes: every change); its first state, its deletion, its deletionTimestamp being set and
	// its move to another primary always do.
	Changes Changes
	// ControllerOwner maps an object to the owner in its controller ownerReference (controller: true)
	// whose kind is the primary's.
	ControllerOwner bool
	// Label maps an object to the primary named by this label's value.
	Label string
	// Annotation maps an object to the primary named by this annotation's value.
	Annotation string
	// Field maps an object to the primary named by the string at this dot-separated path, e.g.
	// "spec.configMapName".
	Field string
	// Priority is that of the passes this query's changes queue (the primary's changes: 0): a higher one
	// is handed out first, and a key already queued rises to it.
	Priority int32
}

// RetryPolicy: a key's nth retry in a row waits BaseDelay * 2^(n-1), at most MaxDelay, and a token of a
// bucket the queue shares (Rate per second, Burst), whichever is later. Zero fields take client-go's
// defaults: 5 ms, 1000 s, 10/s, 100.
type RetryPolicy struct {
	BaseDelay time.Duration
	MaxDelay  time.Duration
	Rate      float64
	Burst     int
}

// Item is one lease on one key, handed to a Reconciler. Until the Reconciler returns (or the lease times
// out) no other pass of the key runs, in this process or any other stream of the queue.
type Item struct {
	// Namespace (empty when cluster-scoped) and Name are the key: the primary object's.
	Namespace string
	Name      string
	// Object is the primary as the sidecar's cache held it when the lease was granted (as spec.View keeps
	// it); nil when a related object queued a key whose primary does not exist.
	Object *Object
	// Deleted says the primary was deleted: Object is its last known state. A deletion is handed out
	// once; after it the key is forgotten unless the object is created again.
	Deleted bool
	// Consistency is Consistent: the state is at least as new as every write this pod made to the
	// primary and, naming a lease of this key, to related objects; or TimedOut: such a write was not seen
	// within the sidecar's consistency timeout and this is the latest state known.
	Consistency Consistency
	// Attempt is 1 for the first pass after a change, n for the nth pass in a row after failures.
	Attempt uint32
	// LastError is the previous pass's error when this pass follows a failure.
	LastError string
	// Finalizing marks a finalize pass: the primary is being deleted and still carries spec.Finalizer,
	// which returning Result{} and a nil error removes.
	Finalizing bool
	// Term is the election's term this lease was granted in (guard writes with it); 0 without an
	// election. In a Sharded queue, the epoch of the key's slot.
	Term uint64
	// LeaseID names the lease; pass it to writes made for this item (ForItem, WithReconcileLease).
	LeaseID string
	// ExpiresAt is when the lease times out and goes back to the queue; the pass's ctx ends then.
	ExpiresAt time.Time

	// election and electionNamespace are the queue's election, for ForItem's guard.
	election          string
	electionNamespace string
	// resource is the queue's primary resource and client the Client whose Reconcile handed the item out,
	// for SetCondition and RecordEvent; queue is the queue's name, RecordEvent's reporting controller.
	resource string
	client   *Client
	queue    string
}

// String names the key as "namespace/name" ("name" when cluster-scoped).
func (i Item) String() string {
	if i.Namespace == "" {
		return i.Name
	}
	return i.Namespace + "/" + i.Name
}

// ForItem marks a write (Create, Update, Patch, Delete, SetCondition) as made for item: it names the item's
// lease (WithReconcileLease), so the key's next pass waits until the queue's watches show the write, and when
// the queue has an election it guards the write with the item's term (WithGuard), so it is refused once
// this sidecar no longer leads in that term (in a Sharded queue the term is the slot's epoch, and the
// write carries the slot's claim). Options given after it override either.
//
//	obj, err := client.Patch(ctx, "configmaps", item.Namespace, item.Name+"-child", consistd.MergePatch, patch,
//		consistd.ForItem(item))
func ForItem(item Item) ObjectOption {
	return func(o *objectOptions) {
		o.reconcileLease = item.LeaseID
		if item.election != "" && item.Term != 0 {
			o.guard = &pb.WriteGuard{Election: item.election, Namespace: item.electionNamespace, Term: item.Term}
		}
	}
}

// SetCondition sets the status condition c of the item's primary (the queue's Resource, the item's
// Namespace and Name), as apimachinery's meta.SetStatusCondition does, in the sidecar (Client.SetCondition):
//
//   - it is written only when it changes (SetConditionResult.Changed): the same status, reason, message and
//     observed generation write nothing;
//   - its lastTransitionTime is kept while its status stays, and is now when the status changes;
//   - its observedGeneration is the metadata.generation of the object the item was handed (Item.Object)
//     unless c.ObservedGeneration is set; 0 when the item has no object or its View left the generation
//     out, and the sidecar then takes the generation it reads;
//   - it goes to the status subresource with server-side apply under a field manager per condition type,
//     "consistd/<type>" (WithFieldManager sets the prefix), so setting one condition never drops another:
//     the primary's status.conditions must be a list map keyed by type, as []metav1.Condition with
//     +listType=map and +listMapKey=type generates (on an atomic list it replaces every other condition);
//   - it is made for the item (ForItem): the key's next pass waits until the queue's watch shows it, and
//     when the queue follows an election it is guarded by the lease's term, refused once this sidecar no
//     longer leads in it.
//
// Options after the item's own override them. Only an item handed out by Reconcile can set a condition.
//
//	if _, err := item.SetCondition(ctx, consistd.Condition{Type: "Ready", Status: consistd.ConditionTrue,
//		Reason: "Available", Message: "3 of 3 replicas"}); err != nil {
//		return consistd.Result{}, err
//	}
func (i Item) SetCondition(ctx context.Context, c Condition, opts ...ObjectOption) (*SetConditionResult, error) {
	if i.client == nil {
		return nil, errors.New("consistd: Item.SetCondition needs an item handed out by Reconcile")
	}
	if c.ObservedGeneration == 0 {
		c.ObservedGeneration = i.generation()
	}
	return i.client.SetCondition(ctx, i.resource, i.Namespace, i.Name, c, append([]ObjectOption{ForItem(i)}, opts...)...)
}

// RecordEvent records an event (events.k8s.io/v1) about the item's primary (the queue's Resource, the
// item's Namespace and Name, and the uid of the object the item was handed, Item.Object), reported by the
// queue: its name (the spec's Name) is the event's reportingController unless e.ReportingController is
// set. It is recorded once in the sidecar for every app of the pod, as client-go's and controller-runtime's
// recorders do (Client.RecordEvent):
//
//   - a repeat within 6 minutes (the same severity, reason, action, reporting controller and object) is
//     counted on the first one's series, not written anew, whichever app of the pod records it;
//   - the reporting controller's events about one object pass client-go's rate limit, a burst of 25, then
//     one per 5 minutes: an event over it is dropped, and RecordEvent answers false.
//
// An event is not a write to the item's primary: it names no lease and no guard. The sidecar needs RBAC to
// create and patch events in the events.k8s.io group. Only an item handed out by Reconcile can record one.
//
//	if err := syncWidget(ctx, item); err != nil {
//		_, _ = item.RecordEvent(ctx, consistd.EventRecord{Severity: consistd.EventWarning,
//			Reason: "SyncFailed", Action: "Reconcile", Note: err.Error()})
//		return consistd.Result{}, err
//	}
func (i Item) RecordEvent(ctx context.Context, e EventRecord) (bool, error) {
	if i.client == nil {
		return false, errors.New("consistd: Item.RecordEvent needs an item handed out by Reconcile")
	}
	if e.UID == "" && i.Object != nil {
		e.UID = i.Object.UID
	}
	if e.ReportingController == "" {
		e.ReportingController = i.queue
	}
	return i.client.RecordEvent(ctx, i.resource, i.Namespace, i.Name, e)
}

// generation is the metadata.generation of the object the item was handed; 0 when there is none.
func (i Item) generation() int64 {
	if i.Object == nil {
		return 0
	}
	var o struct {
		Metadata struct {
			Generation int64 `json:"generation"`
		} `json:"metadata"`
	}
	if json.Unmarshal(i.Object.JSON, &o) != nil {
		return 0
	}
	return o.Metadata.Generation
}

// Reconcile works on the queue spec names, calling r for each item the sidecar hands out, until ctx ends
// (it then returns ctx.Err()) or the sidecar refuses the spec (it then returns that gRPC status, unchanged:
// INVALID_ARGUMENT naming the field, FAILED_PRECONDITION when the queue runs with another spec, NOT_FOUND
// for an unknown resource, PERMISSION_DENIED). Before it returns, every pass still running has returned.
//
// Up to spec.MaxLeases passes run at once, each on a goroutine of its own, never two for one key. A pass's
// ctx ends when the lease times out (Item.ExpiresAt), when the connection to the sidecar is lost (its
// lease went back to the queue), when ctx ends, and once the pass returns. When the pass returns, its
// completion goes to the sidecar (see Reconciler for how the return maps to one); a pass whose ctx ended
// first has no lease left to complete, and its outcome is dropped.
//
// When the connection to the sidecar is lost (UNAVAILABLE, or the stream ends unasked) Reconcile opens
// the stream again with the same spec, with backoff from 100 ms to 5 s. The sidecar has put the old
// stream's leases back in the queue, so the passes still running for them are dropped as above; a key
// handed out again meanwhile waits in this process until its old pass returns (or the new lease times
// out), and the new passes wait for free slots among spec.MaxLeases. A completion the sidecar refuses is
// logged (WithLogger), never fatal: the lease then times out and the key comes again.
//
//	err := client.Reconcile(ctx, consistd.ReconcileSpec{Name: "web", Resource: "configmaps", Namespace: "default"},
//		consistd.ReconcilerFunc(func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
//			if item.Deleted || item.Object == nil {
//				return consistd.Result{}, nil
//			}
//			_, err := client.Patch(ctx, "configmaps", item.Namespace, item.Name, consistd.MergePatch,
//				[]byte(`{"metadata":{"annotations":{"seen":"yes"}}}`), consistd.ForItem(item))
//			return consistd.Result{}, err // an error comes again after a backoff, with Attempt+1
//		}))
func (c *Client) Reconcile(ctx context.Context, spec ReconcileSpec, r Reconciler) error {
	if r == nil {
		return errors.New("consistd: Reconcile needs a Reconciler")
	}
	req, err := spec.request()
	if err != nil {
		return err
	}
	run := &reconcileRun{
		client:     c,
		reconciler: r,
		spec:       spec,
		slots:      make(chan struct{}, max(spec.MaxLeases, 1)),
		running:    map[string]chan struct{}{},
	}
	// Every pass's ctx derives from the stream's, which has ended by the time this runs.
	defer run.passes.Wait()
	var pause backoff
	for {
		err := run.stream(ctx, req, &pause)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !retryable(err):
			return err
		}
		c.logger().Warn("consistd: reconcile lost the connection to the sidecar; opening the stream again",
			"queue", spec.Name, "error", err)
		if !pause.wait(ctx) {
			return ctx.Err()
		}
	}
}

// request is the spec as the stream's first message; a field this API cannot even send is refused here
// as the daemon refuses the others: INVALID_ARGUMENT, "field: why".
func (s ReconcileSpec) request() (*pb.ReconcileRequest, error) {
	leases := uint32(1)
	switch {
	case s.MaxLeases < 0:
		return nil, status.Errorf(codes.InvalidArgument, "spec.max_leases: %d: must be between 1 and 10000 (0 means 1)", s.MaxLeases)
	case int64(s.MaxLeases) > math.MaxUint32:
		leases = math.MaxUint32 // the daemon refuses it, naming the field
	case s.MaxLeases > 0:
		leases = uint32(s.MaxLeases)
	}
	spec := &pb.QueueSpec{
		Name:      s.Name,
		Primary:   &pb.ObjectQuery{Resource: s.Resource, Namespace: s.Namespace, LabelSelector: s.LabelSelector, FieldSelector: s.FieldSelector, View: s.View.proto(), Changes: s.Changes.proto()},
		MaxLeases: leases,
	}
	for i, r := range s.Related {
		q := &pb.RelatedQuery{Query: &pb.ObjectQuery{Resource: r.Resource, Namespace: r.Namespace, LabelSelector: r.LabelSelector, FieldSelector: r.FieldSelector, View: r.View.proto(), Changes: r.Changes.proto()}, Priority: r.Priority}
		set := 0
		if r.ControllerOwner {
			q.MapsBy, set = &pb.RelatedQuery_ControllerOwner{ControllerOwner: true}, set+1
		}
		if r.Label != "" {
			q.MapsBy, set = &pb.RelatedQuery_Label{Label: r.Label}, set+1
		}
		if r.Annotation != "" {
			q.MapsBy, set = &pb.RelatedQuery_Annotation{Annotation: r.Annotation}, set+1
		}
		if r.Field != "" {
			q.MapsBy, set = &pb.RelatedQuery_Field{Field: r.Field}, set+1
		}
		// None set goes to the daemon as is: it refuses it naming the same field.
		if set > 1 {
			return nil, status.Errorf(codes.InvalidArgument, "spec.related[%d].maps_by: %d are set; set one of ControllerOwner, Label, Annotation or Field", i, set)
		}
		spec.Related = append(spec.Related, q)
	}
	if s.Retry != (RetryPolicy{}) {
		if s.Retry.Burst < 0 || int64(s.Retry.Burst) > math.MaxUint32 {
			return nil, status.Errorf(codes.InvalidArgument, "spec.retry.burst: %d: must be 0 (the default, 100) or more", s.Retry.Burst)
		}
		spec.Retry = &pb.RetryPolicy{BaseDelay: optionalDuration(s.Retry.BaseDelay), MaxDelay: optionalDuration(s.Retry.MaxDelay), Rate: s.Retry.Rate, Burst: uint32(s.Retry.Burst)}
	}
	spec.LeaseTimeout = optionalDuration(s.LeaseTimeout)
	if s.Election != "" || s.ElectionNamespace != "" {
		spec.Election = &pb.ElectionRef{Election: s.Election, Namespace: s.ElectionNamespace}
	}
	// Sharded without an election goes to the daemon as is: it refuses it naming spec.sharded.
	spec.Sharded = s.Sharded
	// So does a ShardBy without Sharded (or one the primary cannot be sharded by), naming spec.shard_by.
	spec.ShardBy = pb.ShardBy(s.ShardBy)
	// A finalizer that is not a qualified name goes as it is: the daemon refuses it naming spec.finalizer.
	spec.Finalizer = s.Finalizer
	return &pb.ReconcileRequest{Request: &pb.ReconcileRequest_Spec{Spec: spec}}, nil
}

// optionalDuration is unset for 0 (the daemon's default) and d otherwise (a negative one is refused there).
func optionalDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// completion is the lease's end that a pass's return asks for.
func completion(leaseID string, res Result, err error) *pb.Completion {
	c := &pb.Completion{LeaseId: leaseID, Priority: res.Priority}
	var terminal *terminalError
	switch {
	case errors.As(err, &terminal):
		c.Outcome, c.Error = pb.Outcome_OUTCOME_TERMINAL, truncate(err.Error(), maxCompletionError)
	case err != nil:
		c.Outcome, c.Error = pb.Outcome_OUTCOME_RETRY, truncate(err.Error(), maxCompletionError)
	case res.RequeueAfter > 0:
		c.Outcome = pb.Outcome_OUTCOME_REQUEUE
		c.RequeueAfter = durationpb.New(min(max(res.RequeueAfter, minRequeueAfter), maxRequeueAfter))
	default:
		c.Outcome = pb.Outcome_OUTCOME_DONE
	}
	return c
}

// itemFrom is a work item as the Reconciler gets it.
func itemFrom(w *pb.WorkItem, spec *ReconcileSpec) Item {
	item := Item{
		Namespace: w.GetNamespace(), Name: w.GetName(), Object: objectFrom(w.GetObject()), Deleted: w.GetDeleted(),
		Consistency: Consistency(w.GetConsistency()), Attempt: w.GetAttempt(), LastError: w.GetLastError(),
		Finalizing: w.GetFinalizing(), Term: w.GetTerm(), LeaseID: w.GetLeaseId(),
		election: spec.Election, electionNamespace: spec.ElectionNamespace, resource: spec.Resource,
		queue: spec.Name,
	}
	if w.GetExpiresAt() != nil {
		item.ExpiresAt = w.GetExpiresAt().AsTime()
	}
	return item
}

// reconcileRun is one Reconcile call: its passes, across the streams it opens one after another.
type reconcileRun struct {
	client     *Client
	reconciler Reconciler
	spec       ReconcileSpec
	// slots holds a token per pass running, at most MaxLeases: one stream never has more leases, but
	// passes of a lost stream may still run when the next stream gets its own.
	slots chan struct{}
	// passes counts the pass goroutines, for Reconcile to wait for.
	passes sync.WaitGroup
	mu     sync.Mutex
	// running is, per key, closed when the key's latest pass goroutine ends; a pass of the key waits for
	// the one before it, which only happens across a lost connection.
	running map[string]chan struct{}
}

// stream runs one Reconcile stream until it fails or ctx ends; the passes it started see their ctx end
// with it.
func (run *reconcileRun) stream(ctx context.Context, spec *pb.ReconcileRequest, pause *backoff) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := run.client.reconcile.Reconcile(ctx)
	if err != nil {
		return err
	}
	// A stream that already broke fails Send with io.EOF; Recv gives the reason.
	if err := s.Send(spec); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	first, err := s.Recv()
	if err != nil {
		return streamEnded(err, "reconcile")
	}
	if first.GetStarted() == nil {
		return status.Errorf(codes.Internal, "reconcile: the sidecar answered the spec with %v instead of STARTED", first)
	}
	pause.reset()
	out := &completions{ctx: ctx, stream: s}
	for {
		r, err := s.Recv()
		if err != nil {
			return streamEnded(err, "reconcile")
		}
		switch m := r.GetResponse().(type) {
		case *pb.ReconcileResponse_Item:
			item := itemFrom(m.Item, &run.spec)
			item.client = run.client
			run.start(ctx, item, out)
		case *pb.ReconcileResponse_Refused:
			refusal := m.Refused.GetRefusal()
			run.client.logger().Warn("consistd: the sidecar refused a reconcile completion",
				"queue", run.spec.Name, "lease", m.Refused.GetLeaseId(),
				"code", codes.Code(refusal.GetCode()).String(), "error", refusal.GetMessage())
		}
	}
}

// start runs one pass on a goroutine of its own: after the key's previous pass in this process (one of a
// lost stream) and once a slot is free; then it sends the completion on the stream that granted the lease.
func (run *reconcileRun) start(streamCtx context.Context, item Item, out *completions) {
	key := item.String()
	done := make(chan struct{})
	run.mu.Lock()
	previous := run.running[key]
	run.running[key] = done
	run.mu.Unlock()
	run.passes.Add(1)
	go func() {
		defer run.passes.Done()
		defer func() {
			run.mu.Lock()
			if run.running[key] == done {
				delete(run.running, key)
			}
			run.mu.Unlock()
			close(done)
		}()
		ctx, cancel := passContext(streamCtx, item)
		defer cancel()
		if previous != nil {
			select {
			case <-previous:
			case <-ctx.Done():
				run.dropped(streamCtx, ctx, item, "before its pass started: the key's previous pass still ran")
				return
			}
		}
		select {
		case run.slots <- struct{}{}:
		case <-ctx.Done():
			run.dropped(streamCtx, ctx, item, "before its pass started: no slot of MaxLeases was free")
			return
		}
		res, err := run.call(ctx, item)
		<-run.slots
		if ctx.Err() != nil {
			run.dropped(streamCtx, ctx, item, "while its pass ran")
			return
		}
		out.send(completion(item.LeaseID, res, err))
	}()
}

// passContext is a pass's ctx: it ends with the stream and when the lease times out.
func passContext(streamCtx context.Context, item Item) (context.Context, context.CancelFunc) {
	if item.ExpiresAt.IsZero() {
		return context.WithCancel(streamCtx)
	}
	return context.WithDeadline(streamCtx, item.ExpiresAt)
}

// call runs the Reconciler, turning a panic into an error as controller-runtime does.
func (run *reconcileRun) call(ctx context.Context, item Item) (res Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			run.client.logger().Error("consistd: a reconcile panicked", "queue", run.spec.Name, "key", item.String(),
				"lease", item.LeaseID, "panic", p, "stack", string(debug.Stack()))
			res, err = Result{}, fmt.Errorf("panic: %v [recovered]", p)
		}
	}()
	return run.reconciler.Reconcile(ctx, item)
}

// dropped logs a pass whose lease ran out (it goes back to the queue); one whose stream ended needs no word,
// its loss is logged once.
func (run *reconcileRun) dropped(streamCtx, ctx context.Context, item Item, while string) {
	if streamCtx.Err() != nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return
	}
	run.client.logger().Warn("consistd: a reconcile lease timed out "+while+"; the key goes back to the queue and the pass's outcome is dropped",
		"queue", run.spec.Name, "key", item.String(), "lease", item.LeaseID, "expired", item.ExpiresAt)
}

// completions sends the completions of one stream's leases, one at a time; after the stream ended they
// are dropped (the sidecar has put its leases back in the queue).
type completions struct {
	ctx    context.Context
	mu     sync.Mutex
	stream grpc.BidiStreamingClient[pb.ReconcileRequest, pb.ReconcileResponse]
}

func (c *completions) send(m *pb.Completion) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		return
	}
	// An error means the stream broke; its reader sees why and opens another.
	_ = c.stream.Send(&pb.ReconcileRequest{Request: &pb.ReconcileRequest_Complete{Complete: m}})
}
