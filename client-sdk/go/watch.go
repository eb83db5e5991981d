// Watches that reconnect on their own and resume after the last event they delivered.

package consistd

import (
	"context"
	"encoding/json"
	"iter"
	"slices"
	"strings"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// Mode is how a watch wants its events.
type Mode int32

const (
	// ConsistentMode delivers, per object, only states consistent with this pod's own writes; a slow
	// subscriber gets the latest state per object. The default.
	ConsistentMode = Mode(pb.DeliveryMode_DELIVERY_MODE_CONSISTENT)
	// RawMode delivers every watch event in apiserver order, none skipped.
	RawMode = Mode(pb.DeliveryMode_DELIVERY_MODE_RAW)
)

func (m Mode) String() string {
	return strings.TrimPrefix(pb.DeliveryMode(m).String(), "DELIVERY_MODE_")
}

// EventType says what an Event tells.
type EventType int32

const (
	// Added: the object exists (initial state, creation, or reappearance after a relist).
	Added = EventType(pb.EventType_EVENT_TYPE_ADDED)
	// Modified: the object changed.
	Modified = EventType(pb.EventType_EVENT_TYPE_MODIFIED)
	// Deleted: the object is gone; Event.Object holds its last known state.
	Deleted = EventType(pb.EventType_EVENT_TYPE_DELETED)
	// Synced: every object of the initial state (or of a fresh snapshot) has been delivered.
	Synced = EventType(pb.EventType_EVENT_TYPE_SYNCED)
	// ResyncRequired: the watch could not continue where it was (the daemon restarted, or the
	// subscriber fell behind); a fresh snapshot follows (Added events, then Synced) to reconcile against.
	ResyncRequired = EventType(pb.EventType_EVENT_TYPE_RESYNC_REQUIRED)
)

// String gives the protocol's name without its prefix: "ADDED", "SYNCED", ...
func (t EventType) String() string {
	return strings.TrimPrefix(pb.EventType(t).String(), "EVENT_TYPE_")
}

// Consistency is how an event's state relates to this pod's own writes.
type Consistency int32

const (
	// Consistent: no write of this pod to the object is pending.
	Consistent = Consistency(pb.Consistency_CONSISTENCY_CONSISTENT)
	// AwaitingOwnWrite: a write of this pod is pending and this state predates it (RAW mode only).
	AwaitingOwnWrite = Consistency(pb.Consistency_CONSISTENCY_AWAITING_OWN_WRITE)
	// OwnWrite: exactly the state this pod's own write produced.
	OwnWrite = Consistency(pb.Consistency_CONSISTENCY_OWN_WRITE)
	// TimedOut: this pod's write was not seen in time; this is the latest state known.
	TimedOut = Consistency(pb.Consistency_CONSISTENCY_TIMED_OUT)
)

// String gives the protocol's name without its prefix: "OWN_WRITE", ...
func (c Consistency) String() string {
	return strings.TrimPrefix(pb.Consistency(c).String(), "CONSISTENCY_")
}

// Object is a Kubernetes object as the apiserver served it.
type Object struct {
	// UID is metadata.uid: stable for the object's life.
	UID string
	// Namespace is metadata.namespace; empty for cluster-scoped objects.
	Namespace string
	// Name is metadata.name.
	Name string
	// ResourceVersion is metadata.resourceVersion. Kubernetes 1.35+ makes it a decimal integer that grows
	// with every change (KEP-5504), so two versions of one object compare as numbers; before 1.35,
	// compare for equality only.
	ResourceVersion string
	// JSON is the object (apiVersion, kind, metadata, spec, status, ...). A watch's or queue's objects are
	// as its View keeps them: by default whole but for metadata.managedFields. Get, List and writes answer
	// with whole objects; one read from a watch's cache has managedFields only if that watch keeps them.
	JSON json.RawMessage
	// Unchanged is true when Update or Patch would have changed nothing and was not sent: a synced watch's cache
	// in the sidecar already showed the object as the write would leave it, and this is that cached object (its
	// ResourceVersion unchanged). False on every other object, and on a write sent WithSendUnchanged.
	Unchanged bool
}

// String names the object as "namespace/name" ("name" when cluster-scoped, "-" for nil).
func (o *Object) String() string {
	switch {
	case o == nil:
		return "-"
	case o.Namespace == "":
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}

// Decode unmarshals the object's JSON into v (a map, or a struct such as a client-go type).
func (o *Object) Decode(v any) error { return json.Unmarshal(o.JSON, v) }

func objectFrom(o *pb.KubeObject) *Object {
	if o == nil {
		return nil
	}
	return &Object{UID: o.GetUid(), Namespace: o.GetNamespace(), Name: o.GetName(), ResourceVersion: o.GetResourceVersion(), JSON: o.GetJson()}
}

// WatchRequest names what to watch.
type WatchRequest struct {
	// Resource is a plural ("configmaps"), plural.group ("deployments.apps"), group/version/plural
	// ("apps/v1/deployments") or a kind ("Deployment").
	Resource string
	// Namespace to watch; empty watches every namespace (or a cluster-scoped resource).
	Namespace string
	// LabelSelector is a Kubernetes label selector, e.g. "app=web,tier!=db".
	LabelSelector string
	// FieldSelector is a Kubernetes field selector, e.g. "metadata.name=cfg".
	FieldSelector string
	// Mode is ConsistentMode (when zero) or RawMode.
	Mode Mode
	// ResumeCursor starts after the event with this cursor instead of from a fresh snapshot. A cursor
	// resumes only a watch of the same View.
	ResumeCursor string
	// View is how much of each object the watch keeps and delivers; the zero View is the whole object
	// without metadata.managedFields.
	View View
}

// View is how much of each object a watch (or a queue's query) keeps in the sidecar and delivers: less
// held is less memory in the sidecar. Queries with different views are different upstream watches, each
// with its own cache; queries with the same view share one. The zero View is the whole object without
// metadata.managedFields. The sidecar refuses a bad view with INVALID_ARGUMENT naming the field
// ("view.fields[1]: ...").
//
//	consistd.View{MetadataOnly: true}                                     // metadata only
//	consistd.View{Fields: []string{"spec.replicas", "status.conditions"}} // a projection
type View struct {
	// MetadataOnly keeps only each object's metadata, read with the apiserver's metadata-only requests
	// (PartialObjectMetadata, as client-go's metadata informer and controller-runtime's OnlyMetadata): no
	// spec, status or data. apiVersion and kind still name the resource. Not with Fields.
	MetadataOnly bool
	// Fields keeps only these fields, as dot-separated paths ("spec.replicas", "status.conditions",
	// "metadata.labels"), beside apiVersion, kind and metadata's name, namespace, uid, resourceVersion,
	// generation and deletionTimestamp, which every view keeps. An array is kept whole; a path the object
	// does not have keeps nothing. At most 32 paths; not with MetadataOnly.
	Fields []string
	// ManagedFields keeps metadata.managedFields (server-side apply's bookkeeping), dropped otherwise.
	ManagedFields bool
}

// proto is the view as sent: nil for the zero View, so that a request without one is as before.
func (v View) proto() *pb.ObjectView {
	if !v.MetadataOnly && len(v.Fields) == 0 && !v.ManagedFields {
		return nil
	}
	// A copy of Fields: the request is sent again on every reconnect, after the caller may have changed its
	// slice.
	return &pb.ObjectView{MetadataOnly: v.MetadataOnly, Fields: slices.Clone(v.Fields), ManagedFields: v.ManagedFields}
}

// Event is one change of a watched object, or a marker (Synced, ResyncRequired).
type Event struct {
	// Type says what happened.
	Type EventType
	// Object is the object; nil for Synced and ResyncRequired.
	Object *Object
	// Cursor is the resume position after this event (WatchRequest.ResumeCursor).
	Cursor string
	// Consistency relates the state to this pod's own writes, as the daemon judged it when it sent the
	// event.
	Consistency Consistency
	// PredatesOwnWrite (RawMode only) says that when the app took this Added or Modified event, a write
	// through this Client had already returned a larger resourceVersion of the object: the state is older
	// than what the app itself wrote. ConsistentMode drops such events instead (see Watch).
	PredatesOwnWrite bool
	// PreviousResourceVersion (Modified only) is the resourceVersion of the state of this object the daemon's
	// watch saw directly before this one, so no write to the object came between them (this watch may not
	// have delivered that state). Empty for Added, Deleted and states from a list or snapshot (the first
	// one, a relist, a resync). WatchLatest uses it to not hand a worker back its own write's state.
	PreviousResourceVersion string
}

// Watch streams the request's events: the initial state (Added events, then Synced), then live changes.
// Range over it; breaking out of the loop or ending ctx ends the subscription (the loop then simply
// ends).
//
// When the connection to the sidecar is lost (UNAVAILABLE, or the stream ends unasked) Watch subscribes
// again from the last cursor it received (delivered or dropped), with backoff from 100 ms to 5 s, so
// each event arrives once; if the daemon cannot resume from there (it restarted) the loop sees
// ResyncRequired, then a fresh snapshot and Synced. Any other error is yielded once, as the last value,
// unchanged (a gRPC status).
//
// The own-write rule. The daemon judges a ConsistentMode state when it sends it, so a state sent just
// before the app's own write reached the daemon can still be on its way (in gRPC and socket buffers)
// when that write returns. So Watch checks each Added or Modified event against the resourceVersions
// this Client's writes (Create, Update, Patch, Delete) returned, when the app takes the event: if a write
// returned a larger resourceVersion of the object, the event is dropped in ConsistentMode and delivered
// with PredatesOwnWrite in RawMode. Deleted, Synced and ResyncRequired are never dropped; a version that
// is not a decimal integer is never compared. A dropped event still moves the resume cursor, so it is not
// delivered again after a reconnect.
//
// The check runs after the event is received and right before it is handed to the loop body, on the
// loop's goroutine: an iterator (not a channel filled by a goroutine of the SDK's) receives the next
// event only when the loop asks for it, so no event waits inside the SDK where a check made on arrival
// would go stale while the loop body writes. With iter.Pull2, each call of next is the take. An app
// that forwards events to a queue of its own takes them when it dequeues them: check them again then
// with PredatesOwnWrite.
func (c *Client) Watch(ctx context.Context, req WatchRequest) iter.Seq2[Event, error] {
	return c.events(ctx, req, true)
}

// events is Watch, with the own-write rule applied as the loop takes each event when judged (what Watch
// hands out), or not at all: the reader of WatchLatest applies it where its app's worker takes a state,
// and must see every state the daemon sent to keep its books.
func (c *Client) events(ctx context.Context, req WatchRequest, judged bool) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		mode := pb.DeliveryMode(req.Mode)
		if req.Mode == 0 {
			mode = pb.DeliveryMode_DELIVERY_MODE_CONSISTENT
		}
		request := &pb.SubscribeRequest{
			Resource:      req.Resource,
			Namespace:     req.Namespace,
			LabelSelector: req.LabelSelector,
			FieldSelector: req.FieldSelector,
			Mode:          mode,
			ResumeCursor:  req.ResumeCursor,
			View:          req.View.proto(),
		}
		var pause backoff
		for {
			err := func() error {
				stream, err := c.watch.Subscribe(ctx, request)
				if err != nil {
					return err
				}
				for {
					r, err := stream.Recv()
					if err != nil {
						return streamEnded(err, "watch")
					}
					pause.reset()
					if r.GetCursor() != "" {
						request.ResumeCursor = r.GetCursor()
					}
					ev := Event{
						Type: EventType(r.GetType()), Object: objectFrom(r.GetObject()), Cursor: r.GetCursor(),
						Consistency: Consistency(r.GetConsistency()), PreviousResourceVersion: r.GetPreviousResourceVersion(),
					}
					// The take: nothing runs between this check and the loop body but this goroutine.
					if judged && ev.predatesOwnWrite(c.writes) {
						if mode == pb.DeliveryMode_DELIVERY_MODE_CONSISTENT {
							// Dropped; the cursor above already moved past it.
							continue
						}
						ev.PredatesOwnWrite = true
					}
					if !yield(ev, nil) {
						return errStopped
					}
				}
			}()
			switch {
			case err == errStopped || ctx.Err() != nil:
				return
			case !retryable(err):
				yield(Event{}, err)
				return
			case !pause.wait(ctx):
				return
			}
		}
	}
}

// predatesOwnWrite is the own-write rule: an Added or Modified state older than what a write recorded in
// writes returned. Deleted and the markers never are.
func (ev Event) predatesOwnWrite(writes *ownWrites) bool {
	return (ev.Type == Added || ev.Type == Modified) && writes.predates(ev.Object)
}
