// Unit tests of events without a daemon: the request an item's RecordEvent sends (through a fake reconcile
// stream, as a pass gets its item), the severity mapping and its local refusal, and the answer and errors
// RecordEvent passes on.

package consistd

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// eventRecorder is an objects service that keeps every RecordEvent request and answers recorded(request),
// or refusal when set.
type eventRecorder struct {
	pb.ObjectsServiceClient
	mu       sync.Mutex
	requests []*pb.RecordEventRequest
	recorded func(*pb.RecordEventRequest) bool
	refusal  error
}

func (f *eventRecorder) RecordEvent(_ context.Context, r *pb.RecordEventRequest, _ ...grpc.CallOption) (*pb.RecordEventResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r)
	if f.refusal != nil {
		return nil, f.refusal
	}
	return &pb.RecordEventResponse{Recorded: f.recorded == nil || f.recorded(r)}, nil
}

func (f *eventRecorder) sent() []*pb.RecordEventRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.RecordEventRequest(nil), f.requests...)
}

// passesRecordingEvents runs Reconcile on spec against a fake stream and objects service; each pass records
// the event ev(item) through its item and sends RecordEvent's error on the first channel returned, its
// answer on the second.
func passesRecordingEvents(t *testing.T, spec ReconcileSpec, objects *eventRecorder, ev func(Item) EventRecord) (*fakeQueue, <-chan error, <-chan bool) {
	t.Helper()
	errs, answers := make(chan error, 8), make(chan bool, 8)
	q := passesOnAFakeQueue(t, spec, objects, func(ctx context.Context, item Item) (Result, error) {
		recorded, err := item.RecordEvent(ctx, ev(item))
		answers <- recorded
		errs <- err
		return Result{}, err
	})
	return q, errs, answers
}

func TestAnItemRecordsItsEventAboutThePrimaryReportedByTheQueue(t *testing.T) {
	spec := ReconcileSpec{Name: "bucket-queue", Resource: "example.com/v1/widgets", Namespace: "ns", Election: "lead", ElectionNamespace: "leases"}
	// The sidecar's rate limit drops b's event.
	objects := &eventRecorder{recorded: func(r *pb.RecordEventRequest) bool { return r.GetName() != "b" }}
	severities := map[string]EventSeverity{"a": EventWarning, "b": EventNormal}
	q, errs, answers := passesRecordingEvents(t, spec, objects, func(item Item) EventRecord {
		return EventRecord{Severity: severities[item.Name], Reason: "Reason" + item.Name, Action: "Action" + item.Name, Note: "note of " + item.Name}
	})
	handOut(t, q, errs, &pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a", Term: 3,
		Object: &pb.KubeObject{Uid: "uid-a", Namespace: "ns", Name: "a", Json: []byte(`{"metadata":{"name":"a","uid":"uid-a"}}`)}})
	if recorded := <-answers; !recorded {
		t.Error("a's event: not recorded, but the sidecar recorded it")
	}
	// No object (a related object names a primary that does not exist): no uid, the sidecar reads it.
	handOut(t, q, errs, &pb.WorkItem{LeaseId: "q.1.2", Namespace: "ns", Name: "b", Term: 3})
	if recorded := <-answers; recorded {
		t.Error("b's event: recorded, but the sidecar dropped it")
	}

	// No lease and no guard: an event is not a write to the primary.
	want := []*pb.RecordEventRequest{
		{Resource: "example.com/v1/widgets", Namespace: "ns", Name: "a", Uid: "uid-a", Severity: pb.EventSeverity_EVENT_SEVERITY_WARNING,
			Reason: "Reasona", Action: "Actiona", Note: "note of a", ReportingController: "bucket-queue"},
		{Resource: "example.com/v1/widgets", Namespace: "ns", Name: "b", Severity: pb.EventSeverity_EVENT_SEVERITY_NORMAL,
			Reason: "Reasonb", Action: "Actionb", Note: "note of b", ReportingController: "bucket-queue"},
	}
	sameRequests(t, "RecordEvent", objects.sent(), want)
}

func TestAnItemsEventKeepsAUIDAndAReportingControllerItIsGiven(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "widgets", Namespace: "ns"}
	objects := &eventRecorder{}
	q, errs, answers := passesRecordingEvents(t, spec, objects, func(Item) EventRecord {
		return EventRecord{Severity: EventNormal, Reason: "Synced", Action: "Sync", UID: "uid-given", ReportingController: "example.com/widgets"}
	})
	handOut(t, q, errs, &pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a", Object: &pb.KubeObject{Uid: "uid-a", Namespace: "ns", Name: "a"}})
	<-answers
	want := &pb.RecordEventRequest{Resource: "widgets", Namespace: "ns", Name: "a", Uid: "uid-given",
		Severity: pb.EventSeverity_EVENT_SEVERITY_NORMAL, Reason: "Synced", Action: "Sync", ReportingController: "example.com/widgets"}
	if got := objects.sent(); len(got) != 1 || !proto.Equal(got[0], want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
}

func TestAnEventSeverityThatIsNotNormalOrWarningIsRefusedHereNamingTheField(t *testing.T) {
	objects := &eventRecorder{}
	c := &Client{objects: objects, writes: newOwnWrites()}
	item := Item{Namespace: "ns", Name: "a", client: c, resource: "widgets", queue: "q"}
	for _, bad := range []EventSeverity{"", "normal", "Error"} {
		ev := EventRecord{Severity: bad, Reason: "R", Action: "A"}
		_, err := c.RecordEvent(context.Background(), "widgets", "ns", "a", ev)
		if s := status.Convert(err); err == nil || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), "severity: ") {
			t.Errorf("client, severity %q: %v, want INVALID_ARGUMENT naming severity", bad, err)
		}
		_, err = item.RecordEvent(context.Background(), ev)
		if s := status.Convert(err); err == nil || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), "severity: ") {
			t.Errorf("item, severity %q: %v, want INVALID_ARGUMENT naming severity", bad, err)
		}
	}
	if sent := objects.sent(); len(sent) != 0 {
		t.Errorf("a refused severity was sent: %v", sent)
	}
	// An Item not handed out by Reconcile has nowhere to send it.
	if _, err := (Item{Namespace: "ns", Name: "a"}).RecordEvent(context.Background(), EventRecord{Severity: EventNormal}); err == nil {
		t.Error("an Item made by hand recorded an event")
	}
}

func TestRecordEventSendsTheEventAsGivenAndPassesOnTheSidecarsAnswer(t *testing.T) {
	objects := &eventRecorder{recorded: func(*pb.RecordEventRequest) bool { return false }}
	c := &Client{objects: objects, writes: newOwnWrites()}
	ctx := context.Background()
	recorded, err := c.RecordEvent(ctx, "nodes", "", "n1", EventRecord{Severity: EventWarning, Reason: "Pressure", Action: "Drain", Note: "disk"})
	if err != nil || recorded {
		t.Errorf("a dropped event: %v, %v; want false and no error", recorded, err)
	}
	// No reporting controller: the sidecar's default ("consistd").
	want := &pb.RecordEventRequest{Resource: "nodes", Name: "n1", Severity: pb.EventSeverity_EVENT_SEVERITY_WARNING, Reason: "Pressure", Action: "Drain", Note: "disk"}
	if got := objects.sent(); len(got) != 1 || !proto.Equal(got[0], want) {
		t.Errorf("sent %v, want %v", got, want)
	}
	// The sidecar's error is the call's, its code and message unchanged.
	objects.refusal = status.Error(codes.PermissionDenied, "events.events.k8s.io is forbidden")
	_, err = c.RecordEvent(ctx, "nodes", "", "n1", EventRecord{Severity: EventNormal, Reason: "R", Action: "A"})
	if s := status.Convert(err); s.Code() != codes.PermissionDenied || s.Message() != "events.events.k8s.io is forbidden" {
		t.Errorf("a refusal: %v, want the sidecar's PERMISSION_DENIED", err)
	}
}
