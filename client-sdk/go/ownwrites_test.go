// Unit tests of the own-write rule without a daemon: a fake watch stream whose events have all arrived
// before the app writes, and a fake objects service that answers each write with a given object.

package consistd

import (
	"context"
	"fmt"
	"iter"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// fakeWatch serves one list of responses per Subscribe call, in order. A stream that is not the last
// ends with UNAVAILABLE after its responses (so Watch reconnects); the last one then waits for the end
// of the call.
type fakeWatch struct {
	mu       sync.Mutex
	streams  [][]*pb.SubscribeResponse
	requests []*pb.SubscribeRequest
}

func (f *fakeWatch) Subscribe(ctx context.Context, in *pb.SubscribeRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[pb.SubscribeResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	// Watch reuses its request for the next call: keep a copy of what this one asked.
	f.requests = append(f.requests, proto.Clone(in).(*pb.SubscribeRequest))
	n := len(f.requests) - 1
	if n >= len(f.streams) {
		return nil, status.Error(codes.Internal, "the fake has no more streams")
	}
	return &fakeSubscription{ctx: ctx, responses: f.streams[n], last: n == len(f.streams)-1}, nil
}

func (f *fakeWatch) subscribed() []*pb.SubscribeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

type fakeSubscription struct {
	grpc.ClientStream // only Recv is used
	ctx               context.Context
	responses         []*pb.SubscribeResponse
	last              bool
}

func (s *fakeSubscription) Recv() (*pb.SubscribeResponse, error) {
	if len(s.responses) > 0 {
		r := s.responses[0]
		s.responses = s.responses[1:]
		return r, nil
	}
	if !s.last {
		return nil, status.Error(codes.Unavailable, "the fake cut the stream")
	}
	<-s.ctx.Done()
	return nil, status.FromContextError(s.ctx.Err()).Err()
}

// fakeObjects answers every write with the object in answer.
type fakeObjects struct {
	pb.ObjectsServiceClient // reads are not used
	answer                  *pb.KubeObject
}

func (f *fakeObjects) Create(context.Context, *pb.CreateRequest, ...grpc.CallOption) (*pb.CreateResponse, error) {
	return &pb.CreateResponse{Object: f.answer}, nil
}

func (f *fakeObjects) Update(context.Context, *pb.UpdateRequest, ...grpc.CallOption) (*pb.UpdateResponse, error) {
	return &pb.UpdateResponse{Object: f.answer}, nil
}

func (f *fakeObjects) Patch(context.Context, *pb.PatchRequest, ...grpc.CallOption) (*pb.PatchResponse, error) {
	return &pb.PatchResponse{Object: f.answer}, nil
}

func (f *fakeObjects) Delete(context.Context, *pb.DeleteRequest, ...grpc.CallOption) (*pb.DeleteResponse, error) {
	return &pb.DeleteResponse{Object: f.answer}, nil
}

// fakeClient is a Client whose watches and writes go to the fakes.
func fakeClient(streams ...[]*pb.SubscribeResponse) (*Client, *fakeWatch, *fakeObjects) {
	w, o := &fakeWatch{streams: streams}, &fakeObjects{}
	return &Client{watch: w, objects: o, writes: newOwnWrites()}, w, o
}

func kube(uid, rv string) *pb.KubeObject {
	return &pb.KubeObject{Uid: uid, Namespace: "ns", Name: "cm-" + uid, ResourceVersion: rv, Json: []byte("{}")}
}

func event(t pb.EventType, obj *pb.KubeObject, cursor string) *pb.SubscribeResponse {
	return &pb.SubscribeResponse{Type: t, Object: obj, Cursor: cursor}
}

const (
	added    = pb.EventType_EVENT_TYPE_ADDED
	modified = pb.EventType_EVENT_TYPE_MODIFIED
	deleted  = pb.EventType_EVENT_TYPE_DELETED
	synced   = pb.EventType_EVENT_TYPE_SYNCED
	resync   = pb.EventType_EVENT_TYPE_RESYNC_REQUIRED
)

// taker takes a watch's events one at a time (iter.Pull2: each call is the app taking the next event).
type taker struct {
	t    *testing.T
	next func() (Event, error, bool)
}

func take(t *testing.T, c *Client, mode Mode) *taker {
	ctx, cancel := context.WithCancel(context.Background())
	next, stop := iter.Pull2(c.Watch(ctx, WatchRequest{Resource: "configmaps", Namespace: "ns", Mode: mode}))
	t.Cleanup(func() {
		cancel()
		stop()
	})
	return &taker{t: t, next: next}
}

// expect takes one event and fails unless it is "TYPE uid@rv cursor" (with " predates" when marked).
func (k *taker) expect(want string) Event {
	k.t.Helper()
	ev, err, ok := k.next()
	if !ok || err != nil {
		k.t.Fatalf("no event (error %v), want %s", err, want)
	}
	got := ev.Type.String()
	if ev.Object != nil {
		got += fmt.Sprintf(" %s@%s", ev.Object.UID, ev.Object.ResourceVersion)
	}
	got += " " + ev.Cursor
	if ev.PredatesOwnWrite {
		got += " predates"
	}
	if got != want {
		k.t.Fatalf("took %s, want %s", got, want)
	}
	return ev
}

// ownWriteStream is a snapshot of u@5, then changes to 6, 7 and 9, a deletion at 8 (as a DELETED event
// for a CONSISTENT subscriber that fell behind can carry), a resync marker and a re-add at 7: all of it
// has arrived before the app takes anything.
func ownWriteStream() []*pb.SubscribeResponse {
	return []*pb.SubscribeResponse{
		event(added, kube("u", "5"), "c1"),
		event(synced, nil, "c2"),
		event(modified, kube("u", "6"), "c3"),
		event(modified, kube("u", "7"), "c4"),
		event(modified, kube("u", "9"), "c5"),
		event(deleted, kube("u", "8"), "c6"),
		event(resync, nil, "c7"),
		event(added, kube("u", "7"), "c8"),
		event(synced, nil, "c9"),
	}
}

func TestAConsistentWatchDropsWhenTheAppTakesAnEventOlderThanItsOwnWrite(t *testing.T) {
	c, _, objects := fakeClient(ownWriteStream())
	w := take(t, c, ConsistentMode)
	w.expect("ADDED u@5 c1")
	w.expect("SYNCED c2")

	// The app writes after 6, 7 and 9 arrived but before it took them; its write returned 7.
	objects.answer = kube("u", "7")
	if _, err := c.Patch(context.Background(), "configmaps", "ns", "cm-u", MergePatch, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	w.expect("MODIFIED u@7 c4") // 6 dropped; the version the write returned passes
	w.expect("MODIFIED u@9 c5")
	w.expect("DELETED u@8 c6") // never dropped
	w.expect("RESYNC_REQUIRED c7")
	w.expect("ADDED u@7 c8") // not older than the write
	w.expect("SYNCED c9")
}

func TestARawWatchMarksTheEventsOlderThanTheOwnWriteInsteadOfDroppingThem(t *testing.T) {
	c, fake, objects := fakeClient(ownWriteStream())
	w := take(t, c, RawMode)
	w.expect("ADDED u@5 c1")
	objects.answer = kube("u", "9")
	if _, err := c.Update(context.Background(), "configmaps", "ns", "cm-u", []byte("{}"), WithSubresource("status")); err != nil {
		t.Fatal(err)
	}
	w.expect("SYNCED c2")
	w.expect("MODIFIED u@6 c3 predates")
	w.expect("MODIFIED u@7 c4 predates")
	w.expect("MODIFIED u@9 c5")
	w.expect("DELETED u@8 c6")
	w.expect("RESYNC_REQUIRED c7")
	w.expect("ADDED u@7 c8 predates")
	if mode := fake.subscribed()[0].GetMode(); mode != pb.DeliveryMode_DELIVERY_MODE_RAW {
		t.Fatalf("subscribed in %s, want RAW", mode)
	}
}

func TestADroppedEventMovesTheResumeCursorSoItIsNotDeliveredAgain(t *testing.T) {
	c, fake, objects := fakeClient(
		[]*pb.SubscribeResponse{event(added, kube("u", "5"), "c1"), event(synced, nil, "c2"), event(modified, kube("u", "6"), "c3")},
		[]*pb.SubscribeResponse{event(modified, kube("u", "8"), "c4")},
	)
	w := take(t, c, ConsistentMode)
	w.expect("ADDED u@5 c1")
	w.expect("SYNCED c2")
	objects.answer = kube("u", "8")
	if _, err := c.Create(context.Background(), "configmaps", "ns", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// 6 is dropped, the stream is cut, the watch subscribes again after 6 and gets 8.
	w.expect("MODIFIED u@8 c4")
	requests := fake.subscribed()
	if len(requests) != 2 || requests[1].GetResumeCursor() != "c3" {
		t.Fatalf("subscribed %d times, the last after %q; want twice, the second after the dropped c3", len(requests), requests[len(requests)-1].GetResumeCursor())
	}
}

func TestVersionsThatAreNotIntegersAreNeverCompared(t *testing.T) {
	c, _, objects := fakeClient([]*pb.SubscribeResponse{
		event(modified, kube("u", "opaque"), "c1"),
		event(modified, kube("u", "3"), "c2"),
		event(modified, kube("v", "3"), "c3"),
		event(modified, kube("v", ""), "c4"),
		event(modified, kube("v", "+3"), "c5"),
	})
	// A write answering a version that is not an integer records nothing...
	objects.answer = kube("u", "1e9")
	if _, err := c.Patch(context.Background(), "configmaps", "ns", "cm-u", MergePatch, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// ...and an event whose version is not an integer passes whatever was recorded.
	objects.answer = kube("v", "10")
	if _, err := c.Delete(context.Background(), "configmaps", "ns", "cm-v"); err != nil {
		t.Fatal(err)
	}
	w := take(t, c, ConsistentMode)
	w.expect("MODIFIED u@opaque c1")
	w.expect("MODIFIED u@3 c2")
	// v@3 is older than the recorded 10: dropped.
	w.expect("MODIFIED v@ c4")
	w.expect("MODIFIED v@+3 c5")
}

func TestTheRecordKeepsTheLargestVersionPerUIDAndNothingThatIsNotAnInteger(t *testing.T) {
	w := newOwnWrites()
	obj := func(uid, rv string) *Object { return &Object{UID: uid, ResourceVersion: rv} }
	w.record(obj("u", "9"))
	w.record(obj("u", "5")) // an answer that arrives later with a smaller version changes nothing
	for rv, want := range map[string]bool{"8": true, "9": false, "10": false, "x": false, "": false} {
		if got := w.predates(obj("u", rv)); got != want {
			t.Errorf("u@%q predates the write of 9: %v, want %v", rv, got, want)
		}
	}
	for _, rv := range []string{"abc", "", "-1", "+7", "0x10", "1_000", " 12", "99999999999999999999999"} {
		w.record(obj("n", rv))
	}
	if w.predates(obj("n", "1")) {
		t.Error("a version that is not a decimal integer (or does not fit 64 bits) was recorded")
	}
	w.record(nil)
	w.record(obj("", "4"))
	if w.predates(nil) || w.predates(obj("", "1")) {
		t.Error("an object without a uid predates a write")
	}
}

func TestTheRecordIsBoundedAndForgetsTheLeastRecentlyWrittenFirst(t *testing.T) {
	w := newOwnWrites()
	obj := func(i int, rv string) *Object { return &Object{UID: fmt.Sprint("uid-", i), ResourceVersion: rv} }
	w.record(obj(0, "100"))
	for i := 1; i <= 3*ownWriteGeneration; i++ {
		w.record(obj(i, "100"))
		if i%ownWriteGeneration == ownWriteGeneration/2 {
			w.record(obj(0, "100")) // written again: stays
		}
	}
	if n := len(w.current) + len(w.previous); n > 2*ownWriteGeneration {
		t.Fatalf("%d uids remembered, want at most %d", n, 2*ownWriteGeneration)
	}
	if !w.predates(obj(0, "99")) {
		t.Error("a uid written again recently was forgotten")
	}
	if w.predates(obj(1, "99")) {
		t.Error("the oldest uid written once is still remembered")
	}
	for i := 2*ownWriteGeneration + 1; i <= 3*ownWriteGeneration; i++ {
		if !w.predates(obj(i, "99")) {
			t.Fatalf("uid %d, among the last %d written, was forgotten", i, ownWriteGeneration)
		}
	}
}

func TestTheRecordIsSafeForConcurrentWritesAndWatches(t *testing.T) {
	w := newOwnWrites()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				o := &Object{UID: fmt.Sprint("uid-", (g*2000+i)%3000), ResourceVersion: fmt.Sprint(i + 1)}
				w.record(o)
				w.predates(o)
			}
		})
	}
	wg.Wait()
	if !w.predates(&Object{UID: "uid-0", ResourceVersion: "1"}) {
		t.Fatal("uid-0 was written (up to 1001) and is not remembered")
	}
}
