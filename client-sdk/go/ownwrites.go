// The own-write rule where the app takes an event: the resourceVersions this client's writes returned,
// and the check of a watch event against them.

package consistd

import (
	"strconv"
	"sync"
)

// ownWriteGeneration is how many objects one generation of the record holds; the record keeps two, so
// it remembers the last 10,000 to 20,000 objects this client wrote (about 2.5 MB at most).
const ownWriteGeneration = 10000

// ownWrites is, per object uid, the largest resourceVersion a write through this client returned. It
// belongs to the Client (one connection) and is shared by all its watches; safe for concurrent use.
//
// The daemon applies the own-write rule to a CONSISTENT state when it sends it, so the only states this
// record has to catch are the ones sent before the write reached the daemon and still waiting between
// the daemon and the app's loop (gRPC and socket buffers) when the write returned. Those are taken in
// order, so an entry stops mattering once the app has taken the events queued before its write: the
// record may forget old entries. It forgets the least recently written objects first, by generations
// (when the current map is full it becomes the previous one and the one before is dropped), which needs
// no clock and no per-entry bookkeeping. Without a bound, a controller writing many objects over days
// would keep every uid it ever wrote. What is given up: an app that writes more than
// ownWriteGeneration other objects while a watch sits unread can be handed a state of one of its
// earliest objects older than its write, as it would without the rule.
type ownWrites struct {
	mu       sync.Mutex
	current  map[string]uint64
	previous map[string]uint64
}

func newOwnWrites() *ownWrites {
	return &ownWrites{current: map[string]uint64{}}
}

// resourceVersion reads a resourceVersion as a number. Kubernetes 1.35+ guarantees a decimal integer
// that grows with every change (KEP-5504); any other form (an older apiserver, an aggregated API) is
// opaque and must never be compared, so it reports false.
func resourceVersion(rv string) (uint64, bool) {
	// ParseUint in base 10 takes digits only: no sign, no underscores, no "0x".
	n, err := strconv.ParseUint(rv, 10, 64)
	return n, err == nil
}

// record remembers the object a write returned (nil, or one without a uid or an integer
// resourceVersion, is ignored); a smaller version than the one remembered never replaces it.
func (w *ownWrites) record(o *Object) {
	if o == nil || o.UID == "" {
		return
	}
	rv, ok := resourceVersion(o.ResourceVersion)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.current[o.UID]; ok {
		w.current[o.UID] = max(old, rv)
		return
	}
	if old, ok := w.previous[o.UID]; ok {
		rv = max(old, rv)
		delete(w.previous, o.UID)
	}
	if len(w.current) >= ownWriteGeneration {
		w.previous, w.current = w.current, make(map[string]uint64, ownWriteGeneration)
	}
	w.current[o.UID] = rv
}

// predates reports whether a write through this client returned a larger resourceVersion of o's
// object than o has. Versions that are not integers never predate anything.
func (w *ownWrites) predates(o *Object) bool {
	written, rv, ok := w.lookup(o)
	return ok && written > rv
}

// wrote reports whether o's resourceVersion is exactly the largest one a write through this client
// returned for o's object: o is (as far as the record knows) the state the client's latest write to it
// made. False for nil, for an object without a uid, and for a version that is not a decimal integer.
func (w *ownWrites) wrote(o *Object) bool {
	written, rv, ok := w.lookup(o)
	return ok && written == rv
}

// lookup is the largest resourceVersion a write through this client returned for o's object and o's own,
// both as integers; ok is false for nil, an object without a uid, a version that is not a decimal integer
// and an object the record does not (or no longer) hold.
func (w *ownWrites) lookup(o *Object) (written, rv uint64, ok bool) {
	if o == nil || o.UID == "" {
		return 0, 0, false
	}
	if rv, ok = resourceVersion(o.ResourceVersion); !ok {
		return 0, 0, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if written, ok = w.current[o.UID]; !ok {
		written, ok = w.previous[o.UID]
	}
	return written, rv, ok
}

// PredatesOwnWrite reports whether a write through this client (Create, Update, Patch, Delete) has
// returned a larger resourceVersion of obj's object than obj has: obj is older than what the app itself
// already wrote. Watch applies this check when the app takes each event; an app that forwards events to
// a queue of its own before handling them takes them later than Watch hands them over, and can ask again
// with this when it takes one from its queue (WatchLatest is that queue, with this check where its worker
// takes a state). False for nil and for a resourceVersion that is not a decimal integer (those are never
// compared).
func (c *Client) PredatesOwnWrite(obj *Object) bool { return c.writes.predates(obj) }
