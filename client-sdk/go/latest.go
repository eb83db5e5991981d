// The newest state per object of a ConsistentMode watch, handed to the app's workers when they ask, with
// the own-write rule applied at that moment and a worker's own write not handed back to it: the way to
// consume a watch whose handler is slow.
//
// An app that reads a watch into a buffer of its own (the newest state per object) while a worker per
// object handles one state at a time takes each state twice: when its reader takes it from the watch, and
// when its worker takes it from the buffer. Watch applies the own-write rule at the first take; a state
// taken while the worker was still writing then waits in the buffer, and the worker, once its write
// returned, handles a state older than it (issue 46, item 5: a Kopf-shaped app executed one value twice in
// 56). Here the buffer is the SDK's, and the rule is applied when a worker is handed a state.

package consistd

import (
	"context"
	"encoding/json"
	"iter"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrLatestClosed is what Latest.Next returns once the Latest was closed or the ctx it was made with ended
// (a gRPC status error, CANCELLED).
var ErrLatestClosed = status.Error(codes.Canceled, "consistd: the newest-state watch was closed")

// Latest is the newest state of each object of a ConsistentMode watch, for workers that ask for the next
// one when they are ready (Client.WatchLatest). Safe for concurrent use by any number of workers.
//
//   - One pending state per object. A goroutine of the SDK's reads the watch continuously and keeps, per
//     object (namespace and name), only the newest state not yet handed out: a Deleted replaces whatever
//     waited, and so does a later state (a re-created object's Added replaces its deletion). That is the
//     bound: one event per object, plus the identity (namespace, name, uid, resourceVersion) of each object
//     the watch says exists (to tell deletions after a resync) and of its state last handed out (to tell a
//     worker's own write).
//   - Pulled, never pushed. A worker asks for the next object's newest state (Next); a slow worker never
//     holds up the reader, and is never handed a state that waited in a queue while a newer one came.
//   - The own-write rule where the worker takes it. An Added or Modified state older than a write this
//     Client made and saw return is dropped when it would be handed out, however long it waited: a worker
//     is never handed a state that predates its own write (the write's own state follows).
//   - A worker's own write is not handed back. A Modified state is dropped too when it is the state this
//     Client's own write made directly on top of the state of that object last handed out: its
//     PreviousResourceVersion is that state's resourceVersion (same uid), and its resourceVersion is exactly
//     the largest one this Client's writes returned for the object. The worker already has it and nothing
//     else happened in between. Still handed out: a state whose previous state is another writer's, a state
//     with no previous (Added, or from a list or resync), and a state made by more than one write since the
//     last hand-out. The state last handed out (or dropped so) is kept per object until its deletion.
//   - One worker per object at a time. An object handed out is in progress until its Taken's Done; newer
//     states wait meanwhile and are handed out after. So N workers can share one Latest, each on a
//     different object.
//   - Markers. Synced and ResyncRequired are not handed out. After ResyncRequired (the watch could not
//     resume), every object of the fresh snapshot is handed out again, and at its Synced each object the
//     watch said existed but the snapshot does not hold is handed out as Deleted, its Object carrying only
//     its identity (JSON {"metadata": {name, namespace, uid, resourceVersion}}).
//   - Errors. An error that ends the watch (anything but a lost connection, which the watch resumes from)
//     is returned by every Next from then on, at once; states still pending are dropped.
type Latest struct {
	writes *ownWrites
	cancel context.CancelFunc

	mu sync.Mutex
	// changed is closed (and replaced) at every change: a state ready, an object done, the watch ended.
	changed chan struct{}
	// pending is the newest state of each object not handed out yet.
	pending map[objectKey]Event
	// ready are the keys with a pending state and no worker, oldest first: the order they are handed out in.
	ready []objectKey
	// taken are the keys a worker holds.
	taken map[objectKey]bool
	// live is the identity of each object the watch says exists: what a resync's snapshot is checked against.
	live map[objectKey]Object
	// resync, since ResyncRequired and until its Synced, holds the keys the fresh snapshot held; nil otherwise.
	resync map[objectKey]bool
	// seen is, per object, the identity of its last state handed to a worker or dropped as the state of the
	// Client's own write on it: what a worker has, to tell its own write's state from one holding another
	// change. A deletion forgets the object, so it holds live objects only.
	seen map[objectKey]seenState
	// failed is what ended the watch.
	failed error
}

// objectKey names an object: its namespace (empty when cluster-scoped) and name.
type objectKey struct{ namespace, name string }

// seenState is the state of an object a worker last had: its uid and resourceVersion.
type seenState struct{ uid, resourceVersion string }

// Taken is the state handed to a worker: the object's newest event when it was handed out. The object
// stays in progress, handed to no other worker, until Done.
type Taken struct {
	// Event is Added, Modified or Deleted.
	Event Event

	latest *Latest
	key    objectKey
	once   sync.Once
}

// WatchLatest is the newest state of each object req names, from a ConsistentMode watch (whatever req.Mode
// says), handed to workers as they ask (see Latest): the way to consume a ConsistentMode watch when the
// handler is slow. A worker never handles a state older than this Client's own write to the object, is not
// handed back the state its own write made on the state it had when nothing else changed in between, and
// never handles an object another worker holds. The reader runs until ctx ends or Close.
//
//	latest := client.WatchLatest(ctx, consistd.WatchRequest{Resource: "configmaps", Namespace: "default"})
//	defer latest.Close()
//	for range 4 {
//		go func() {
//			for {
//				taken, err := latest.Next(ctx)
//				if err != nil {
//					return
//				}
//				handle(ctx, taken.Event) // no other worker has this object meanwhile
//				taken.Done()
//			}
//		}()
//	}
func (c *Client) WatchLatest(ctx context.Context, req WatchRequest) *Latest {
	req.Mode = ConsistentMode
	ctx, cancel := context.WithCancel(ctx)
	return newLatest(cancel, c.events(ctx, req, false), c.writes)
}

// newLatest reads events into a new Latest judged against writes; cancel ends events (Close).
func newLatest(cancel context.CancelFunc, events iter.Seq2[Event, error], writes *ownWrites) *Latest {
	l := &Latest{
		writes:  writes,
		cancel:  cancel,
		changed: make(chan struct{}),
		pending: map[objectKey]Event{},
		taken:   map[objectKey]bool{},
		live:    map[objectKey]Object{},
		seen:    map[objectKey]seenState{},
	}
	go l.read(events)
	return l
}

// Next waits for the next object with a pending state that no worker holds, and hands its newest state
// out (dropping, at this moment, a state older than the Client's own write to it, and the state the
// Client's own write made directly on the state last handed out); call Done on what it returns when the
// work is over. It returns the error that ended the watch (ErrLatestClosed once closed), or ctx's error if
// ctx ends first.
func (l *Latest) Next(ctx context.Context) (*Taken, error) {
	for {
		l.mu.Lock()
		if l.failed != nil {
			err := l.failed
			l.mu.Unlock()
			return nil, err
		}
		if key, ev, ok := l.handOut(); ok {
			l.mu.Unlock()
			return &Taken{Event: ev, latest: l, key: key}, nil
		}
		changed := l.changed
		l.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Pending is how many objects have a state waiting (held by a worker or not).
func (l *Latest) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// Close ends the watch; Next returns ErrLatestClosed from then on.
func (l *Latest) Close() {
	l.cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail(ErrLatestClosed)
}

// Namespace is the object's namespace; empty when cluster-scoped.
func (t *Taken) Namespace() string { return t.key.namespace }

// Name is the object's name.
func (t *Taken) Name() string { return t.key.name }

// Done ends the work on this object: a state that came meanwhile is handed out next. Calling it again
// does nothing.
func (t *Taken) Done() {
	t.once.Do(func() {
		l := t.latest
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.taken, t.key)
		if _, waiting := l.pending[t.key]; waiting {
			l.ready = append(l.ready, t.key)
		}
		l.wake()
	})
}

// read takes every event of the watch into the books, until the watch fails or ends (Close, or the ctx
// of WatchLatest).
func (l *Latest) read(events iter.Seq2[Event, error]) {
	for ev, err := range events {
		l.mu.Lock()
		if err != nil {
			l.fail(err)
			l.mu.Unlock()
			return
		}
		l.arrived(ev)
		l.wake()
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fail(ErrLatestClosed)
}

// arrived takes in one event of the watch. l.mu is held.
func (l *Latest) arrived(ev Event) {
	switch ev.Type {
	case ResyncRequired:
		l.resync = map[objectKey]bool{}
	case Synced:
		if l.resync == nil {
			return
		}
		for key, identity := range l.live {
			if !l.resync[key] {
				delete(l.live, key)
				l.put(key, deletedEvent(identity, ev.Cursor))
			}
		}
		l.resync = nil
	case Added, Modified, Deleted:
		if ev.Object == nil {
			return
		}
		key := objectKey{ev.Object.Namespace, ev.Object.Name}
		if ev.Type == Deleted {
			delete(l.live, key)
		} else {
			identity := *ev.Object
			identity.JSON = nil
			l.live[key] = identity
			if l.resync != nil {
				l.resync[key] = true
			}
		}
		l.put(key, ev)
	}
}

// put makes ev the key's pending state, replacing an older one; the key becomes ready unless it already
// was or a worker holds it. A deletion forgets the state a worker last had. l.mu is held.
func (l *Latest) put(key objectKey, ev Event) {
	if ev.Type == Deleted {
		delete(l.seen, key)
	}
	if _, waiting := l.pending[key]; !waiting && !l.taken[key] {
		l.ready = append(l.ready, key)
	}
	l.pending[key] = ev
}

// handOut takes the next ready key and its state. Two kinds of state are dropped here, at the take: one
// older than the Client's own write (the own-write rule), and the state the Client's own write made
// directly on the state last handed out for that object (its previous state is that one, same uid, and its
// resourceVersion is the one the write returned), which the worker that wrote it already has; a state
// holding any other change since, or with no previous state (a list's, a resync's), is handed out. l.mu is
// held.
func (l *Latest) handOut() (objectKey, Event, bool) {
	for len(l.ready) > 0 {
		key := l.ready[0]
		l.ready = l.ready[1:]
		ev, ok := l.pending[key]
		if !ok {
			continue
		}
		delete(l.pending, key)
		if ev.predatesOwnWrite(l.writes) {
			continue // its own write's state follows on the watch
		}
		if ev.Type != Deleted { // a deletion forgot the object's entry when it arrived (put)
			last, had := l.seen[key]
			l.seen[key] = seenState{ev.Object.UID, ev.Object.ResourceVersion}
			if had && last.uid == ev.Object.UID && ev.PreviousResourceVersion != "" &&
				ev.PreviousResourceVersion == last.resourceVersion && l.writes.wrote(ev.Object) {
				continue // the worker's own write on the state it had: it has this one already
			}
		}
		l.taken[key] = true
		return key, ev, true
	}
	return objectKey{}, Event{}, false
}

// fail ends the Latest with err (the first error stays). l.mu is held.
func (l *Latest) fail(err error) {
	if l.failed != nil {
		return
	}
	l.failed = err
	clear(l.pending)
	clear(l.seen)
	l.ready = nil
	l.wake()
}

// wake tells every waiting Next that something changed. l.mu is held.
func (l *Latest) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// deletedEvent is the Deleted event of an object a resync's snapshot no longer holds: its identity, and as
// JSON its metadata.
func deletedEvent(identity Object, cursor string) Event {
	metadata := map[string]string{"name": identity.Name, "uid": identity.UID, "resourceVersion": identity.ResourceVersion}
	if identity.Namespace != "" {
		metadata["namespace"] = identity.Namespace
	}
	identity.JSON, _ = json.Marshal(map[string]any{"metadata": metadata})
	return Event{Type: Deleted, Object: &identity, Cursor: cursor}
}
