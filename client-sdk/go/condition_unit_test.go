// Unit tests of status conditions without a daemon: the request an item's SetCondition sends (through a
// fake reconcile stream, as a pass gets its item), the status mapping and its local refusal, and which
// answers SetCondition records for the own-write rule.

package consistd

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// conditionRecorder is an objects service that keeps every SetCondition request and answers with answer.
type conditionRecorder struct {
	pb.ObjectsServiceClient
	mu       sync.Mutex
	requests []*pb.SetConditionRequest
	answer   *pb.SetConditionResponse
}

func (f *conditionRecorder) SetCondition(_ context.Context, r *pb.SetConditionRequest, _ ...grpc.CallOption) (*pb.SetConditionResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r)
	return f.answer, nil
}

func (f *conditionRecorder) sent() []*pb.SetConditionRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.SetConditionRequest(nil), f.requests...)
}

// passesSettingConditions runs Reconcile on spec against a fake stream and objects service; each pass sets
// the condition cond(item) through its item and sends SetCondition's error on the channel returned.
func passesSettingConditions(t *testing.T, spec ReconcileSpec, cond func(Item) Condition, opts ...ObjectOption) (*fakeQueue, *conditionRecorder, <-chan error) {
	t.Helper()
	objects := &conditionRecorder{answer: &pb.SetConditionResponse{Changed: true, LastTransitionTime: "2026-01-02T03:04:05Z"}}
	set := make(chan error, 8)
	q := passesOnAFakeQueue(t, spec, objects, func(ctx context.Context, item Item) (Result, error) {
		_, err := item.SetCondition(ctx, cond(item), opts...)
		set <- err
		return Result{}, err
	})
	return q, objects, set
}

// handOut grants the item and waits for its pass's call (SetCondition, RecordEvent), whose error the pass
// sends on set.
func handOut(t *testing.T, q *fakeQueue, set <-chan error, item *pb.WorkItem) {
	t.Helper()
	item.ExpiresAt = timestamppb.New(time.Now().Add(time.Minute))
	q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Item{Item: item}})
	select {
	case err := <-set:
		if err != nil {
			t.Fatalf("the call of pass %s: %v", item.GetLeaseId(), err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("no call of pass %s within 5 s", item.GetLeaseId())
	}
	q.next(t) // its completion
}

// sameRequests fails the test unless got are the requests want, in order (proto.Equal); method names
// their call.
func sameRequests[M proto.Message](t *testing.T, method string, got, want []M) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d %s requests, want %d: %v", len(got), method, len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d:\n got %v\nwant %v", i, got[i], want[i])
		}
	}
}

func TestAnItemSetsItsConditionOnThePrimaryWithTheHandedGenerationForItsLease(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "example.com/v1/widgets", Namespace: "ns", Election: "lead", ElectionNamespace: "leases"}
	statuses := map[string]ConditionStatus{"a": ConditionTrue, "b": ConditionFalse, "c": ConditionUnknown}
	q, objects, set := passesSettingConditions(t, spec, func(item Item) Condition {
		return Condition{Type: "Ready", Status: statuses[item.Name], Reason: "Reason" + item.Name, Message: "message of " + item.Name}
	})
	handOut(t, q, set, &pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a", Term: 3,
		Object: &pb.KubeObject{Namespace: "ns", Name: "a", Json: []byte(`{"metadata":{"name":"a","generation":7},"spec":{"size":1}}`)}})
	// No object (a related object names a primary that does not exist): 0, the sidecar's read generation.
	handOut(t, q, set, &pb.WorkItem{LeaseId: "q.1.2", Namespace: "ns", Name: "b", Term: 3})
	// An object without a generation (a view that left it out): 0 as well.
	handOut(t, q, set, &pb.WorkItem{LeaseId: "q.1.3", Namespace: "ns", Name: "c", Term: 4,
		Object: &pb.KubeObject{Namespace: "ns", Name: "c", Json: []byte(`{"metadata":{"name":"c"}}`)}})

	want := []*pb.SetConditionRequest{
		{Resource: "example.com/v1/widgets", Namespace: "ns", Name: "a", ReconcileLease: "q.1.1",
			Condition: &pb.Condition{Type: "Ready", Status: pb.ConditionStatus_CONDITION_STATUS_TRUE, Reason: "Reasona", Message: "message of a", ObservedGeneration: 7},
			Guard:     &pb.WriteGuard{Election: "lead", Namespace: "leases", Term: 3}},
		{Resource: "example.com/v1/widgets", Namespace: "ns", Name: "b", ReconcileLease: "q.1.2",
			Condition: &pb.Condition{Type: "Ready", Status: pb.ConditionStatus_CONDITION_STATUS_FALSE, Reason: "Reasonb", Message: "message of b"},
			Guard:     &pb.WriteGuard{Election: "lead", Namespace: "leases", Term: 3}},
		{Resource: "example.com/v1/widgets", Namespace: "ns", Name: "c", ReconcileLease: "q.1.3",
			Condition: &pb.Condition{Type: "Ready", Status: pb.ConditionStatus_CONDITION_STATUS_UNKNOWN, Reason: "Reasonc", Message: "message of c"},
			Guard:     &pb.WriteGuard{Election: "lead", Namespace: "leases", Term: 4}},
	}
	sameRequests(t, "SetCondition", objects.sent(), want)
}

func TestAnItemsConditionTakesTheOptionsAfterItsOwnAndAGenerationItIsGiven(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "widgets", Namespace: "ns"}
	q, objects, set := passesSettingConditions(t, spec, func(Item) Condition {
		return Condition{Type: "example.com/Synced", Status: ConditionTrue, Reason: "Synced", ObservedGeneration: 2}
	}, WithFieldManager("web"), WithReconcileLease("q.other"))
	handOut(t, q, set, &pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a",
		Object: &pb.KubeObject{Namespace: "ns", Name: "a", Json: []byte(`{"metadata":{"generation":7}}`)}})
	want := &pb.SetConditionRequest{Resource: "widgets", Namespace: "ns", Name: "a", FieldManager: "web", ReconcileLease: "q.other",
		Condition: &pb.Condition{Type: "example.com/Synced", Status: pb.ConditionStatus_CONDITION_STATUS_TRUE, Reason: "Synced", ObservedGeneration: 2}}
	if got := objects.sent(); len(got) != 1 || !proto.Equal(got[0], want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func TestAConditionStatusThatIsNotTrueFalseOrUnknownIsRefusedHereNamingTheField(t *testing.T) {
	objects := &conditionRecorder{answer: &pb.SetConditionResponse{}}
	c := &Client{objects: objects, writes: newOwnWrites()}
	for _, bad := range []ConditionStatus{"", "true", "Yes"} {
		_, err := c.SetCondition(context.Background(), "widgets", "ns", "a", Condition{Type: "Ready", Status: bad, Reason: "R"})
		if s := status.Convert(err); err == nil || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), "condition.status: ") {
			t.Errorf("status %q: %v, want INVALID_ARGUMENT naming condition.status", bad, err)
		}
	}
	if sent := objects.sent(); len(sent) != 0 {
		t.Errorf("a refused status was sent: %v", sent)
	}
	// An Item not handed out by Reconcile has nowhere to send it.
	if _, err := (Item{Namespace: "ns", Name: "a"}).SetCondition(context.Background(), Condition{Type: "Ready", Status: ConditionTrue}); err == nil {
		t.Error("an Item made by hand set a condition")
	}
}

func TestSetConditionRecordsTheObjectForTheOwnWriteRuleOnlyWhenItWrote(t *testing.T) {
	objects := &conditionRecorder{}
	c := &Client{objects: objects, writes: newOwnWrites()}
	ctx := context.Background()
	ready := Condition{Type: "Ready", Status: ConditionTrue, Reason: "Up"}

	// Nothing written: the object as read is not recorded.
	objects.answer = &pb.SetConditionResponse{Object: kube("u1", "10"), Changed: false, LastTransitionTime: "2026-01-02T03:04:05Z"}
	res, err := c.SetCondition(ctx, "widgets", "ns", "cm-u1", ready)
	if err != nil {
		t.Fatal(err)
	}
	if res.Changed || res.Object.ResourceVersion != "10" || !res.LastTransitionTime.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("answer %+v, want unchanged version 10 at 2026-01-02T03:04:05Z", res)
	}
	if older := objectFrom(kube("u1", "9")); c.PredatesOwnWrite(older) {
		t.Error("an answer that wrote nothing was recorded as an own write")
	}

	// Written: recorded.
	objects.answer = &pb.SetConditionResponse{Object: kube("u1", "11"), Changed: true, LastTransitionTime: "2026-01-02T03:04:06Z"}
	if res, err = c.SetCondition(ctx, "widgets", "ns", "cm-u1", ready); err != nil {
		t.Fatal(err)
	}
	if !res.Changed || !res.LastTransitionTime.Equal(time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)) {
		t.Errorf("answer %+v, want changed at 2026-01-02T03:04:06Z", res)
	}
	if older := objectFrom(kube("u1", "10")); !c.PredatesOwnWrite(older) {
		t.Error("the object a written condition returned was not recorded as an own write")
	}
	// A lastTransitionTime that is not RFC 3339 (a loose schema) is zero, not an error.
	objects.answer = &pb.SetConditionResponse{Object: kube("u1", "11"), LastTransitionTime: "yesterday"}
	if res, err = c.SetCondition(ctx, "widgets", "ns", "cm-u1", ready); err != nil || !res.LastTransitionTime.IsZero() {
		t.Errorf("an unreadable lastTransitionTime: %+v, %v; want zero and no error", res, err)
	}
}
