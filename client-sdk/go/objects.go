// Reads and writes of Kubernetes objects through the sidecar, JSON in and out, writes optionally guarded.

package consistd

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// PatchType is a patch format the apiserver accepts.
type PatchType int32

const (
	// JSONPatch is an RFC 6902 JSON patch.
	JSONPatch = PatchType(pb.PatchType_PATCH_TYPE_JSON)
	// MergePatch is an RFC 7386 JSON merge patch.
	MergePatch = PatchType(pb.PatchType_PATCH_TYPE_MERGE)
	// StrategicMergePatch is a Kubernetes strategic merge patch (built-in types only).
	StrategicMergePatch = PatchType(pb.PatchType_PATCH_TYPE_STRATEGIC)
	// ApplyPatch is server-side apply; needs WithFieldManager.
	ApplyPatch = PatchType(pb.PatchType_PATCH_TYPE_APPLY)
)

// Propagation is how a Delete handles the object's dependents.
type Propagation int32

const (
	// Orphan leaves the dependents.
	Orphan = Propagation(pb.PropagationPolicy_PROPAGATION_POLICY_ORPHAN)
	// Background deletes the dependents after the object.
	Background = Propagation(pb.PropagationPolicy_PROPAGATION_POLICY_BACKGROUND)
	// Foreground deletes the dependents before the object.
	Foreground = Propagation(pb.PropagationPolicy_PROPAGATION_POLICY_FOREGROUND)
)

// Guard fences a write (WithGuard) or a send (SendRequest.Guard): the daemon refuses it with
// FAILED_PRECONDITION unless it leads Election in exactly Term when it sends the write or stores the
// message.
type Guard struct {
	// Election is the election's name.
	Election string
	// Namespace is the election Lease's namespace; empty means the daemon's own.
	Namespace string
	// Term is the fencing term the caller was told it leads (Leadership.Term). Terms start at 1: a guard
	// with Term 0 (what an unset term reads as) is refused with InvalidArgument naming guard.term.
	Term uint64
}

// proto is the guard as the protocol's WriteGuard; nil for a nil guard.
func (g *Guard) proto() *pb.WriteGuard {
	if g == nil {
		return nil
	}
	return &pb.WriteGuard{Election: g.Election, Namespace: g.Namespace, Term: g.Term}
}

// guardFrom is the protocol's WriteGuard as a Guard; nil for an unset one.
func guardFrom(g *pb.WriteGuard) *Guard {
	if g == nil {
		return nil
	}
	return &Guard{Election: g.GetElection(), Namespace: g.GetNamespace(), Term: g.GetTerm()}
}

// ObjectOption tunes one object call; each option names the calls it applies to and is ignored by others.
type ObjectOption func(*objectOptions)

type objectOptions struct {
	guard          *pb.WriteGuard
	fieldManager   string
	subresource    string
	force          bool
	readYourWrites bool
	uid            string
	version        string
	propagation    pb.PropagationPolicy
	reconcileLease string
	sendUnchanged  bool
}

func collect(opts []ObjectOption) objectOptions {
	var o objectOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithGuard makes a write (Create, Update, Patch, Delete, SetCondition) conditional on leading g.Election
// in g.Term.
func WithGuard(g Guard) ObjectOption {
	return func(o *objectOptions) {
		o.guard = g.proto()
	}
}

// WithReconcileLease marks a write (Create, Update, Patch, Delete, SetCondition) as made for the work item
// holding this lease (Item.LeaseID): the key's next pass waits until the queue's watch of the written object
// (the primary's, or a related query's) shows this write. Writes to the primary itself are waited for
// without it. Inside a Reconciler, ForItem(item) gives this option and, when the queue has an election, the
// guard.
func WithReconcileLease(leaseID string) ObjectOption {
	return func(o *objectOptions) { o.reconcileLease = leaseID }
}

// WithSendUnchanged sends an Update or Patch to the apiserver even when the sidecar's watch cache shows it would
// change nothing, for an app that wants the apiserver's own answer (its admission, its resourceVersion check)
// every time. Without it, such a write is answered from the cache: the cached object, with Unchanged set.
func WithSendUnchanged() ObjectOption {
	return func(o *objectOptions) { o.sendUnchanged = true }
}

// WithFieldManager sets the field manager the apiserver records (Create, Update, Patch); default
// "consistd", required for ApplyPatch. For SetCondition it is the prefix of each type's field manager.
func WithFieldManager(name string) ObjectOption {
	return func(o *objectOptions) { o.fieldManager = name }
}

// WithSubresource writes a subresource such as "status" instead of the object (Update, Patch).
func WithSubresource(name string) ObjectOption {
	return func(o *objectOptions) { o.subresource = name }
}

// WithForce takes ownership of conflicting fields (Patch with ApplyPatch).
func WithForce() ObjectOption {
	return func(o *objectOptions) { o.force = true }
}

// WithReadYourWrites makes a read served from the cache first wait until this pod's pending writes are
// visible (Get, List).
func WithReadYourWrites() ObjectOption {
	return func(o *objectOptions) { o.readYourWrites = true }
}

// WithPreconditions deletes only if the object still has this uid and/or resourceVersion; empty
// strings are not checked (Delete).
func WithPreconditions(uid, resourceVersion string) ObjectOption {
	return func(o *objectOptions) { o.uid, o.version = uid, resourceVersion }
}

// WithPropagation sets how dependents are handled (Delete); the resource's default otherwise.
func WithPropagation(p Propagation) ObjectOption {
	return func(o *objectOptions) { o.propagation = pb.PropagationPolicy(p) }
}

// List is a List call's answer.
type List struct {
	// Objects are the matching objects.
	Objects []*Object
	// ResourceVersion is the list's resourceVersion.
	ResourceVersion string
}

// Get reads one object; namespace is empty for cluster-scoped resources. Options: WithReadYourWrites.
func (c *Client) Get(ctx context.Context, resource, namespace, name string, opts ...ObjectOption) (*Object, error) {
	o := collect(opts)
	r, err := c.objects.Get(ctx, &pb.GetRequest{Resource: resource, Namespace: namespace, Name: name, ReadYourWrites: o.readYourWrites})
	if err != nil {
		return nil, err
	}
	return objectFrom(r.GetObject()), nil
}

// List reads the objects of a resource matching a label selector (empty: all); an empty namespace lists
// every namespace. Options: WithReadYourWrites.
func (c *Client) List(ctx context.Context, resource, namespace, labelSelector string, opts ...ObjectOption) (*List, error) {
	o := collect(opts)
	r, err := c.objects.List(ctx, &pb.ListRequest{Resource: resource, Namespace: namespace, LabelSelector: labelSelector, ReadYourWrites: o.readYourWrites})
	if err != nil {
		return nil, err
	}
	list := &List{ResourceVersion: r.GetResourceVersion()}
	for _, obj := range r.GetObjects() {
		list.Objects = append(list.Objects, objectFrom(obj))
	}
	return list, nil
}

// Create creates an object from obj: JSON as []byte or json.RawMessage, or any value json.Marshal
// accepts (a map, a client-go type). Options: WithGuard, WithFieldManager, WithReconcileLease (ForItem).
func (c *Client) Create(ctx context.Context, resource, namespace string, obj any, opts ...ObjectOption) (*Object, error) {
	body, err := toJSON(obj)
	if err != nil {
		return nil, err
	}
	o := collect(opts)
	r, err := c.objects.Create(ctx, &pb.CreateRequest{Resource: resource, Namespace: namespace, Object: body, FieldManager: o.fieldManager, Guard: o.guard, ReconcileLease: o.reconcileLease})
	if err != nil {
		return nil, err
	}
	return c.written(r.GetObject(), false), nil
}

// Update replaces an object with obj (as for Create); metadata.resourceVersion in obj makes it
// conditional. When a synced watch's cache in the sidecar shows the update would change nothing, it is not
// sent, and the cached object comes back with Unchanged set. Options: WithGuard, WithFieldManager,
// WithSubresource, WithReconcileLease (ForItem), WithSendUnchanged.
func (c *Client) Update(ctx context.Context, resource, namespace, name string, obj any, opts ...ObjectOption) (*Object, error) {
	body, err := toJSON(obj)
	if err != nil {
		return nil, err
	}
	o := collect(opts)
	r, err := c.objects.Update(ctx, &pb.UpdateRequest{Resource: resource, Namespace: namespace, Name: name, Object: body, Subresource: o.subresource, FieldManager: o.fieldManager, Guard: o.guard, ReconcileLease: o.reconcileLease, SendUnchanged: o.sendUnchanged})
	if err != nil {
		return nil, err
	}
	return c.written(r.GetObject(), r.GetUnchanged()), nil
}

// Patch patches an object with patch (JSON, as for Create) in the given format. When a synced watch's cache in
// the sidecar shows a MergePatch or JSONPatch would change nothing, it is not sent, and the cached object comes
// back with Unchanged set (strategic merge and apply patches always go). Options: WithGuard, WithFieldManager,
// WithSubresource, WithForce, WithReconcileLease (ForItem), WithSendUnchanged.
func (c *Client) Patch(ctx context.Context, resource, namespace, name string, kind PatchType, patch any, opts ...ObjectOption) (*Object, error) {
	body, err := toJSON(patch)
	if err != nil {
		return nil, err
	}
	o := collect(opts)
	r, err := c.objects.Patch(ctx, &pb.PatchRequest{
		Resource: resource, Namespace: namespace, Name: name, PatchType: pb.PatchType(kind), Patch: body,
		Subresource: o.subresource, FieldManager: o.fieldManager, Force: o.force, Guard: o.guard,
		ReconcileLease: o.reconcileLease, SendUnchanged: o.sendUnchanged,
	})
	if err != nil {
		return nil, err
	}
	return c.written(r.GetObject(), r.GetUnchanged()), nil
}

// Delete deletes an object and returns its last state when the apiserver gave it (else nil). Options:
// WithGuard, WithPreconditions, WithPropagation, WithReconcileLease (ForItem).
func (c *Client) Delete(ctx context.Context, resource, namespace, name string, opts ...ObjectOption) (*Object, error) {
	o := collect(opts)
	r, err := c.objects.Delete(ctx, &pb.DeleteRequest{
		Resource: resource, Namespace: namespace, Name: name, PreconditionUid: o.uid,
		PreconditionResourceVersion: o.version, PropagationPolicy: o.propagation, Guard: o.guard,
		ReconcileLease: o.reconcileLease,
	})
	if err != nil {
		return nil, err
	}
	return c.written(r.GetObject(), false), nil
}

// ConditionStatus is a condition's status, as metav1.ConditionStatus: ConditionTrue, ConditionFalse or
// ConditionUnknown. SetCondition refuses any other value.
type ConditionStatus string

const (
	// ConditionTrue is "True".
	ConditionTrue ConditionStatus = "True"
	// ConditionFalse is "False".
	ConditionFalse ConditionStatus = "False"
	// ConditionUnknown is "Unknown".
	ConditionUnknown ConditionStatus = "Unknown"
)

// proto is the status as the protocol's ConditionStatus; false for a value that is none of the three.
func (s ConditionStatus) proto() (pb.ConditionStatus, bool) {
	switch s {
	case ConditionTrue:
		return pb.ConditionStatus_CONDITION_STATUS_TRUE, true
	case ConditionFalse:
		return pb.ConditionStatus_CONDITION_STATUS_FALSE, true
	case ConditionUnknown:
		return pb.ConditionStatus_CONDITION_STATUS_UNKNOWN, true
	}
	return pb.ConditionStatus_CONDITION_STATUS_UNSPECIFIED, false
}

// Condition is one condition of an object's status.conditions, as metav1.Condition has it but for
// lastTransitionTime, which is the sidecar's to set.
type Condition struct {
	// Type is the condition's type, e.g. "Ready" (metav1.Condition's rules: at most 316 characters, with an
	// optional DNS subdomain prefix and '/').
	Type string
	// Status is ConditionTrue, ConditionFalse or ConditionUnknown.
	Status ConditionStatus
	// Reason says why, in CamelCase ("Available"; at most 1024 characters).
	Reason string
	// Message is for humans (at most 32768 bytes).
	Message string
	// ObservedGeneration is the metadata.generation the condition was judged on; 0 means the generation of
	// the object as the sidecar reads it. Item.SetCondition sets it from the object the item was handed.
	ObservedGeneration int64
}

// SetConditionResult is the sidecar's answer to SetCondition.
type SetConditionResult struct {
	// Object is the object as the write left it, or as read when nothing was written.
	Object *Object
	// Changed says a write was sent; false when the object had the condition already.
	Changed bool
	// LastTransitionTime is the condition's lastTransitionTime as written, or as it was when nothing was
	// written: it moves only when the status does. Zero if the object holds one that is not RFC 3339.
	LastTransitionTime time.Time
}

// SetCondition sets one condition of an object's status.conditions, as apimachinery's
// meta.SetStatusCondition does, in the sidecar: it reads the object (from a covering watch's cache with
// this pod's own writes in it, else from the apiserver), and when the condition of that type there has the
// same status, reason, message and observed generation it writes nothing (Changed false). Otherwise it
// applies the condition alone to the status subresource with server-side apply, its lastTransitionTime
// kept while its status stays, else now. Each type is applied under a field manager of its own,
// "<field manager>/<type>" (WithFieldManager sets the prefix, default "consistd"), so setting one
// condition never drops another: status.conditions must be a list map keyed by type
// (x-kubernetes-list-type: map, x-kubernetes-list-map-keys: [type], as []metav1.Condition with
// +listType=map and +listMapKey=type generates); on an atomic list the write replaces every other
// condition. A resource without a status subresource answers NOT_FOUND. A status that is none of
// ConditionTrue, ConditionFalse and ConditionUnknown is refused here, INVALID_ARGUMENT naming
// condition.status. The object is recorded for the own-write rule only when it was written. Options:
// WithGuard, WithFieldManager, WithReconcileLease (ForItem); Item.SetCondition sets one on an item's
// primary.
func (c *Client) SetCondition(ctx context.Context, resource, namespace, name string, cond Condition, opts ...ObjectOption) (*SetConditionResult, error) {
	s, ok := cond.Status.proto()
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "condition.status: %q is not True, False or Unknown", string(cond.Status))
	}
	o := collect(opts)
	r, err := c.objects.SetCondition(ctx, &pb.SetConditionRequest{
		Resource: resource, Namespace: namespace, Name: name,
		Condition: &pb.Condition{
			Type: cond.Type, Status: s, Reason: cond.Reason, Message: cond.Message,
			ObservedGeneration: cond.ObservedGeneration,
		},
		FieldManager: o.fieldManager, Guard: o.guard, ReconcileLease: o.reconcileLease,
	})
	if err != nil {
		return nil, err
	}
	res := &SetConditionResult{Object: objectFrom(r.GetObject()), Changed: r.GetChanged()}
	if res.Changed {
		c.writes.record(res.Object)
	}
	// Parsing takes fractional seconds too; one that does not parse stays zero.
	if t, err := time.Parse(time.RFC3339, r.GetLastTransitionTime()); err == nil {
		res.LastTransitionTime = t
	}
	return res, nil
}

// EventSeverity is an event's type, as an events.k8s.io/v1 Event has it (corev1.EventTypeNormal and
// EventTypeWarning): EventNormal or EventWarning. RecordEvent refuses any other value.
type EventSeverity string

const (
	// EventNormal is "Normal": something happened, nothing to worry about.
	EventNormal EventSeverity = "Normal"
	// EventWarning is "Warning": something is not as it should be.
	EventWarning EventSeverity = "Warning"
)

// proto is the severity as the protocol's EventSeverity; false for a value that is neither of the two.
func (s EventSeverity) proto() (pb.EventSeverity, bool) {
	switch s {
	case EventNormal:
		return pb.EventSeverity_EVENT_SEVERITY_NORMAL, true
	case EventWarning:
		return pb.EventSeverity_EVENT_SEVERITY_WARNING, true
	}
	return pb.EventSeverity_EVENT_SEVERITY_UNSPECIFIED, false
}

// EventRecord is an event to record about an object (RecordEvent): the fields of an events.k8s.io/v1
// Event an app chooses. The sidecar fills in the rest (regarding, reportingInstance, eventTime, series).
// (Event is a watch's event.)
type EventRecord struct {
	// Severity is EventNormal or EventWarning.
	Severity EventSeverity
	// Reason says why, in CamelCase ("Drifted"); 1 to 128 characters.
	Reason string
	// Action says what was done or failed, in CamelCase ("Reconcile"); 1 to 128 characters.
	Action string
	// Note is for humans; at most 1024 bytes.
	Note string
	// UID is the object's metadata.uid, when the app has it; empty: the sidecar reads it (and names an
	// object that is gone without one). Item.RecordEvent takes the uid of the object the item was handed.
	UID string
	// ReportingController names the controller reporting the event ("example.com/bucket-operator"; at most
	// 128 characters); empty: "consistd". Item.RecordEvent reports as the queue (its spec's Name) unless
	// it is set.
	ReportingController string
}

// RecordEvent records an event (events.k8s.io/v1) about an object, in the object's namespace ("default"
// for a cluster-scoped one), correlated in the sidecar as client-go's recorder does, once for every app of
// the pod: an event with the same severity, reason, action, reporting controller and object as one
// recorded within 6 minutes is counted on that one's series (its count and lastObservedTime; its note
// stays the first's), not written anew; and a reporting controller's events about one object pass
// client-go's rate limit, a burst of 25, then one per 5 minutes. It answers false when that limit dropped
// the event. A severity that is neither EventNormal nor EventWarning is refused here, INVALID_ARGUMENT
// naming severity; other errors are the sidecar's, as for the other calls. The sidecar needs RBAC to
// create and patch events (events.k8s.io). Nothing is written to the object, so nothing is recorded for the
// own-write rule; Item.RecordEvent records one about an item's primary.
func (c *Client) RecordEvent(ctx context.Context, resource, namespace, name string, e EventRecord) (bool, error) {
	s, ok := e.Severity.proto()
	if !ok {
		return false, status.Errorf(codes.InvalidArgument, "severity: %q is not Normal or Warning", string(e.Severity))
	}
	r, err := c.objects.RecordEvent(ctx, &pb.RecordEventRequest{
		Resource: resource, Namespace: namespace, Name: name, Uid: e.UID,
		Severity: s, Reason: e.Reason, Action: e.Action, Note: e.Note,
		ReportingController: e.ReportingController,
	})
	if err != nil {
		return false, err
	}
	return r.GetRecorded(), nil
}

// written converts the object a write returned (unchanged: the answer said the write was not sent) and
// records its resourceVersion for the own-write rule of this client's watches (Watch). An unchanged answer is
// recorded like any other: the cached object is a state the object has, never older than this pod's own writes
// to it, so a state older than it is rightly held back; the record keeps the largest version either way.
func (c *Client) written(o *pb.KubeObject, unchanged bool) *Object {
	obj := objectFrom(o)
	if obj != nil {
		obj.Unchanged = unchanged
	}
	c.writes.record(obj)
	return obj
}

// toJSON passes JSON bytes through and marshals anything else.
func toJSON(v any) ([]byte, error) {
	switch v := v.(type) {
	case []byte:
		return v, nil
	case json.RawMessage:
		return v, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("consistd: encoding the object as JSON: %w", err)
	}
	return b, nil
}
