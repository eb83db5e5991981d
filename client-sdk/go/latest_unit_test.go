// Unit tests of the newest state per object (Latest) without a daemon: a fed watch, the own-write record
// written by hand.

package consistd

import (
	"context"
	"encoding/json"
	"errors"
	"iter"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fed is a watch whose events the test sends; an error ends it.
type fed struct {
	t      *testing.T
	events chan fedItem
	latest *Latest
	writes *ownWrites
}

type fedItem struct {
	ev  Event
	err error
}

// newFed is a Latest on a fed watch, closed when the test ends.
func newFed(t *testing.T) *fed {
	f := &fed{t: t, events: make(chan fedItem, 64), writes: newOwnWrites()}
	ctx, cancel := context.WithCancel(context.Background())
	var events iter.Seq2[Event, error] = func(yield func(Event, error) bool) {
		for {
			select {
			case item := <-f.events:
				if !yield(item.ev, item.err) || item.err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}
	f.latest = newLatest(cancel, events, f.writes)
	t.Cleanup(f.latest.Close)
	return f
}

func state(kind EventType, name, rv string) Event {
	return Event{Type: kind, Object: &Object{UID: "uid-" + name, Namespace: "ns", Name: name, ResourceVersion: rv, JSON: []byte("{}")}, Cursor: "c" + rv, Consistency: Consistent}
}

func (f *fed) send(events ...Event) {
	for _, ev := range events {
		f.events <- fedItem{ev: ev}
	}
	f.settle()
}

// settle waits until the reader has taken in everything sent.
func (f *fed) settle() {
	deadline := time.Now().Add(5 * time.Second)
	for len(f.events) > 0 {
		if time.Now().After(deadline) {
			f.t.Fatal("the reader took nothing in")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
}

// next is the next state handed out, within 5 s.
func (f *fed) next() *Taken {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	taken, err := f.latest.Next(ctx)
	if err != nil {
		f.t.Fatalf("no state handed out: %v", err)
	}
	return taken
}

// nothingReady checks that nothing is handed out within 50 ms.
func (f *fed) nothingReady() {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if taken, err := f.latest.Next(ctx); err == nil {
		f.t.Fatalf("handed out %v %v", taken.Event.Type, taken.Event.Object)
	}
}

func seen(t *Taken) string {
	return t.Event.Type.String() + " " + t.Event.Object.Name + " " + t.Event.Object.ResourceVersion
}

func TestOnlyTheNewestStateOfEachObjectIsHandedOutInTheOrderObjectsBecameReady(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"), state(Added, "b", "2"), Event{Type: Synced}, state(Modified, "a", "3"), state(Modified, "a", "4"))
	if n := f.latest.Pending(); n != 2 {
		t.Fatalf("%d pending, want 2", n)
	}
	for _, want := range []string{"MODIFIED a 4", "ADDED b 2"} {
		if got := seen(f.next()); got != want {
			t.Fatalf("handed out %q, want %q", got, want)
		}
	}
	f.nothingReady()
}

func TestAnObjectAWorkerHoldsIsHandedToNoOtherUntilItIsDoneThenItsNewestStateIs(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	f.send(state(Modified, "a", "2"), state(Modified, "a", "3"))
	f.nothingReady()
	f.send(state(Added, "b", "4"))
	if got := f.next().Event.Object.Name; got != "b" {
		t.Fatalf("handed out %s meanwhile, want b", got)
	}
	after := make(chan *Taken, 1)
	go func() { after <- f.next() }()
	select {
	case taken := <-after:
		t.Fatalf("a was handed out while held: %s", seen(taken))
	case <-time.After(50 * time.Millisecond):
	}
	held.Done()
	held.Done() // again: nothing more
	if got := seen(<-after); got != "MODIFIED a 3" {
		t.Fatalf("handed out %q after Done, want MODIFIED a 3", got)
	}
}

func TestAStateOlderThanAnOwnWriteThatReturnedWhileItWaitedIsDroppedWhenHandedOut(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	// Another writer's state arrives while the worker writes; the worker's write returns version 3.
	f.send(state(Modified, "a", "2"))
	f.writes.record(state(Modified, "a", "3").Object)
	held.Done()
	f.nothingReady()
	if n := f.latest.Pending(); n != 0 {
		t.Fatalf("%d pending: the older state was not dropped", n)
	}
	f.send(state(Modified, "a", "3"))
	if got := seen(f.next()); got != "MODIFIED a 3" {
		t.Fatalf("handed out %q, want the write's own state", got)
	}
}

func TestADeletionReplacesTheWaitingStateAndIsHandedOutWhateverTheOwnWrites(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	f.send(state(Modified, "a", "2"), state(Deleted, "a", "2"))
	f.writes.record(state(Modified, "a", "9").Object)
	held.Done()
	if got := seen(f.next()); got != "DELETED a 2" {
		t.Fatalf("handed out %q, want the deletion", got)
	}
}

func TestAfterAResyncObjectsMissingFromTheSnapshotAreHandedOutDeleted(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"), state(Added, "b", "2"), state(Added, "c", "3"), Event{Type: Synced})
	for range 3 {
		f.next().Done()
	}
	f.send(state(Deleted, "c", "4"))
	f.next().Done()
	// The watch could not resume: a fresh snapshot without b.
	f.send(Event{Type: ResyncRequired}, state(Added, "a", "1"))
	if got := seen(f.next()); got != "ADDED a 1" {
		t.Fatalf("handed out %q, want a again", got)
	}
	f.nothingReady()
	f.send(Event{Type: Synced})
	gone := f.next()
	if got := seen(gone); got != "DELETED b 2" {
		t.Fatalf("handed out %q, want b deleted", got)
	}
	var object struct{ Metadata map[string]string }
	if err := json.Unmarshal(gone.Event.Object.JSON, &object); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"name": "b", "namespace": "ns", "uid": "uid-b", "resourceVersion": "2"}
	for k, v := range want {
		if object.Metadata[k] != v {
			t.Errorf("metadata %v, want %v", object.Metadata, want)
		}
	}
	f.nothingReady()
}

func TestTheErrorThatEndsTheWatchReachesEveryWorkerThatAsksAndCloseEndsTheWaits(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	f.next()
	failed := make(chan error, 1)
	go func() {
		_, err := f.latest.Next(context.Background())
		failed <- err
	}()
	time.Sleep(20 * time.Millisecond)
	f.events <- fedItem{err: status.Error(codes.NotFound, "no such resource")}
	if err := <-failed; status.Code(err) != codes.NotFound {
		t.Fatalf("the waiting worker got %v, want NOT_FOUND", err)
	}
	if _, err := f.latest.Next(context.Background()); status.Code(err) != codes.NotFound {
		t.Fatalf("a later Next got %v, want NOT_FOUND", err)
	}

	closed := newFed(t)
	go func() {
		_, err := closed.latest.Next(context.Background())
		failed <- err
	}()
	time.Sleep(20 * time.Millisecond)
	closed.latest.Close()
	if err := <-failed; !errors.Is(err, ErrLatestClosed) || status.Code(err) != codes.Canceled {
		t.Fatalf("a Next waiting at Close got %v, want ErrLatestClosed", err)
	}
}

// on is state, made directly on top of the state of the object at previous (its PreviousResourceVersion).
func on(previous string, ev Event) Event {
	ev.PreviousResourceVersion = previous
	return ev
}

// wrote records ev's state as one this Client's own write returned.
func (f *fed) wrote(ev Event) Event {
	f.writes.record(ev.Object)
	return ev
}

// dropped checks that nothing is handed out and nothing waits: the state sent last was dropped.
func (f *fed) dropped(what string) {
	f.t.Helper()
	f.nothingReady()
	if n := f.latest.Pending(); n != 0 {
		f.t.Fatalf("%d pending: %s was not dropped", n, what)
	}
}

func TestAWorkerIsNotHandedBackTheStateItsOwnWriteMadeOnTheStateItHadButIsHandedAnotherWritersNext(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	// The worker writes on the state it holds; that write's state arrives while it still holds the object.
	f.send(f.wrote(on("1", state(Modified, "a", "2"))))
	held.Done()
	f.dropped("the state of the worker's own write on 1")
	// Another writer's change on top of it is handed out.
	f.send(on("2", state(Modified, "a", "3")))
	held = f.next()
	if got := seen(held); got != "MODIFIED a 3" {
		t.Fatalf("handed out %q, want the other writer's MODIFIED a 3", got)
	}
	// The worker writes on it and is done before the write's state arrives: not handed back either.
	write := f.wrote(on("3", state(Modified, "a", "4")))
	held.Done()
	f.send(write)
	f.dropped("the state of the worker's own write on 3, arriving after Done")
	f.send(on("4", state(Modified, "a", "5")))
	if got := seen(f.next()); got != "MODIFIED a 5" {
		t.Fatalf("handed out %q, want the other writer's MODIFIED a 5", got)
	}
}

func TestTheStateOfAnOwnWriteOnAnotherWritersStateNoWorkerHadIsHandedOut(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	// Another writer's change comes while the worker writes; the worker's write lands on top of it.
	f.send(on("1", state(Modified, "a", "2")))
	f.send(f.wrote(on("2", state(Modified, "a", "3"))))
	held.Done()
	held = f.next()
	if got := seen(held); got != "MODIFIED a 3" {
		t.Fatalf("handed out %q, want MODIFIED a 3: it holds the change of 2, which no worker had", got)
	}
	// On the state it was just handed, the worker's next write is not handed back.
	f.send(f.wrote(on("3", state(Modified, "a", "4"))))
	held.Done()
	f.dropped("the state of the worker's own write on 3")
}

func TestTheStateOfAnOwnWriteWithNoPreviousStateIsHandedOut(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	f.send(f.wrote(on("1", state(Modified, "a", "2"))))
	held.Done()
	f.dropped("the state of the worker's own write on 1")
	// The app writes again; the watch then relists, and the state comes with no previous: what came
	// between the lists was never seen.
	f.send(f.wrote(state(Modified, "a", "3")))
	if got := seen(f.next()); got != "MODIFIED a 3" {
		t.Fatalf("handed out %q, want MODIFIED a 3: no previous state, so no telling what came in between", got)
	}
}

func TestADeletionForgetsTheStateAWorkerHadAndARecreatedObjectIsJudgedOnItsOwn(t *testing.T) {
	f := newFed(t)
	f.send(state(Added, "a", "1"))
	held := f.next()
	f.send(f.wrote(on("1", state(Modified, "a", "2"))))
	held.Done()
	f.dropped("the state of the worker's own write on 1")
	f.send(state(Deleted, "a", "2"))
	gone := f.next()
	if got := seen(gone); got != "DELETED a 2" {
		t.Fatalf("handed out %q, want the deletion", got)
	}
	gone.Done()
	f.latest.mu.Lock()
	remembered := len(f.latest.seen)
	f.latest.mu.Unlock()
	if remembered != 0 {
		t.Fatalf("%d objects remembered after the only one was deleted", remembered)
	}
	// Re-created under the same name (a new uid), by this app: its write on the new object's first state,
	// which no worker had, is handed out; the state after it that the worker writes is not.
	recreated := func(ev Event) Event {
		ev.Object.UID = "uid-a-2"
		return ev
	}
	f.send(recreated(state(Added, "a", "3")))
	f.send(f.wrote(recreated(on("3", state(Modified, "a", "4")))))
	held = f.next()
	if got := seen(held); got != "MODIFIED a 4" {
		t.Fatalf("handed out %q, want MODIFIED a 4", got)
	}
	f.send(f.wrote(recreated(on("4", state(Modified, "a", "5")))))
	held.Done()
	f.dropped("the state of the worker's own write on 4")
}
