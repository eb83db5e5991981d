// Unit tests of the reconciler without a daemon: how a pass's return becomes its completion, the spec as
// sent (its views too, a sharded queue's, its finalizer), writes naming the lease, and, against a fake
// stream, an item's finalize pass and what happens across a lost connection and to a refused completion.

package consistd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

func TestAPassesReturnIsItsCompletion(t *testing.T) {
	failed := errors.New("the backend said no")
	long := errors.New(strings.Repeat("é", 3000)) // 6000 bytes
	for _, c := range []struct {
		name  string
		res   Result
		err   error
		want  pb.Outcome
		after time.Duration
		text  string
	}{
		{"done", Result{}, nil, pb.Outcome_OUTCOME_DONE, 0, ""},
		{"a negative requeue is done", Result{RequeueAfter: -time.Second}, nil, pb.Outcome_OUTCOME_DONE, 0, ""},
		{"requeue", Result{RequeueAfter: 2 * time.Second}, nil, pb.Outcome_OUTCOME_REQUEUE, 2 * time.Second, ""},
		{"requeue under 1 ms", Result{RequeueAfter: time.Nanosecond}, nil, pb.Outcome_OUTCOME_REQUEUE, time.Millisecond, ""},
		{"requeue over a day", Result{RequeueAfter: 48 * time.Hour}, nil, pb.Outcome_OUTCOME_REQUEUE, 24 * time.Hour, ""},
		{"a requeue's priority", Result{RequeueAfter: time.Second, Priority: 7}, nil, pb.Outcome_OUTCOME_REQUEUE, time.Second, ""},
		{"done's priority", Result{Priority: -2}, nil, pb.Outcome_OUTCOME_DONE, 0, ""},
		{"error", Result{}, failed, pb.Outcome_OUTCOME_RETRY, 0, "the backend said no"},
		{"an error wins over a requeue", Result{RequeueAfter: time.Second}, failed, pb.Outcome_OUTCOME_RETRY, 0, "the backend said no"},
		{"terminal", Result{}, TerminalError(failed), pb.Outcome_OUTCOME_TERMINAL, 0, "terminal error: the backend said no"},
		{"wrapped terminal", Result{}, fmt.Errorf("syncing: %w", TerminalError(failed)), pb.Outcome_OUTCOME_TERMINAL, 0, "syncing: terminal error: the backend said no"},
		{"a long error", Result{}, long, pb.Outcome_OUTCOME_RETRY, 0, strings.Repeat("é", 2048)},
	} {
		got := completion("q.1.1", c.res, c.err)
		if got.GetLeaseId() != "q.1.1" || got.GetOutcome() != c.want || got.GetError() != c.text {
			t.Errorf("%s: completion %.200v, want %s with error %.60q", c.name, got, c.want, c.text)
		}
		if c.after != 0 && got.GetRequeueAfter().AsDuration() != c.after {
			t.Errorf("%s: requeue after %s, want %s", c.name, got.GetRequeueAfter().AsDuration(), c.after)
		}
		if got.GetPriority() != c.res.Priority && c.err == nil {
			t.Errorf("%s: priority %d, want %d", c.name, got.GetPriority(), c.res.Priority)
		}
		if c.after == 0 && got.RequeueAfter != nil {
			t.Errorf("%s: requeue_after set with %s (the daemon refuses it)", c.name, got.GetOutcome())
		}
	}
}

func TestTerminalErrorsAreFoundByErrorsIsAndAs(t *testing.T) {
	cause := errors.New("bad spec")
	err := fmt.Errorf("reconciling: %w", TerminalError(cause))
	if !errors.Is(err, TerminalError(nil)) {
		t.Error("errors.Is(wrapped, TerminalError(nil)) is false")
	}
	if !errors.Is(err, cause) {
		t.Error("a terminal error does not unwrap to its cause")
	}
	if errors.Is(cause, TerminalError(nil)) {
		t.Error("a plain error is terminal")
	}
	var terminal *terminalError
	if !errors.As(err, &terminal) {
		t.Error("errors.As finds no terminal error")
	}
}

func TestTheSpecIsSentWithItsDefaultsAndAFieldThatCannotBeSentIsRefusedByName(t *testing.T) {
	req, err := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns"}.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{Name: "q", Primary: &pb.ObjectQuery{Resource: "configmaps", Namespace: "ns"}, MaxLeases: 1}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}

	full := ReconcileSpec{
		Name: "q", Resource: "apps/v1/deployments", Namespace: "ns", LabelSelector: "app=web", FieldSelector: "metadata.name=x",
		Related: []Related{
			{Resource: "pods", Namespace: "ns", LabelSelector: "role=child", ControllerOwner: true},
			{Resource: "configmaps", Label: "owner"},
			{Resource: "secrets", Annotation: "example.com/owner"},
			{Resource: "services", Field: "spec.selector.app"},
		},
		MaxLeases: 8, Retry: RetryPolicy{BaseDelay: 200 * time.Millisecond, Burst: 5}, LeaseTimeout: time.Minute,
		Election: "lead", ElectionNamespace: "ns",
	}
	req, err = full.request()
	if err != nil {
		t.Fatal(err)
	}
	want = &pb.QueueSpec{
		Name:    "q",
		Primary: &pb.ObjectQuery{Resource: "apps/v1/deployments", Namespace: "ns", LabelSelector: "app=web", FieldSelector: "metadata.name=x"},
		Related: []*pb.RelatedQuery{
			{Query: &pb.ObjectQuery{Resource: "pods", Namespace: "ns", LabelSelector: "role=child"}, MapsBy: &pb.RelatedQuery_ControllerOwner{ControllerOwner: true}},
			{Query: &pb.ObjectQuery{Resource: "configmaps"}, MapsBy: &pb.RelatedQuery_Label{Label: "owner"}},
			{Query: &pb.ObjectQuery{Resource: "secrets"}, MapsBy: &pb.RelatedQuery_Annotation{Annotation: "example.com/owner"}},
			{Query: &pb.ObjectQuery{Resource: "services"}, MapsBy: &pb.RelatedQuery_Field{Field: "spec.selector.app"}},
		},
		MaxLeases:    8,
		Retry:        &pb.RetryPolicy{BaseDelay: durationpb.New(200 * time.Millisecond), Burst: 5},
		LeaseTimeout: durationpb.New(time.Minute),
		Election:     &pb.ElectionRef{Election: "lead", Namespace: "ns"},
	}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}

	for field, bad := range map[string]ReconcileSpec{
		"spec.max_leases":         {Name: "q", Resource: "configmaps", MaxLeases: -1},
		"spec.related[1].maps_by": {Name: "q", Resource: "configmaps", Related: []Related{{Resource: "pods", Label: "x"}, {Resource: "pods", Label: "x", ControllerOwner: true}}},
		"spec.retry.burst":        {Name: "q", Resource: "configmaps", Retry: RetryPolicy{Burst: -1}},
		"":/* unset maps_by: the daemon names it */ {Name: "q", Resource: "configmaps", Related: []Related{{Resource: "pods"}}},
	} {
		_, err := bad.request()
		if field == "" {
			if err != nil {
				t.Errorf("a related query without a mapping is refused here (%v); the daemon names it", err)
			}
			continue
		}
		if s := status.Convert(err); err == nil || s.Code() != codes.InvalidArgument || !strings.HasPrefix(s.Message(), field+": ") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT naming the field", field, err)
		}
	}
}

func TestAShardedSpecIsSentWithItsElectionAndItsItemsGuardIsThatElectionInTheSlotsEpoch(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Election: "web", ElectionNamespace: "leases", Sharded: true}
	req, err := spec.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{
		Name: "q", Primary: &pb.ObjectQuery{Resource: "configmaps"}, MaxLeases: 1,
		Election: &pb.ElectionRef{Election: "web", Namespace: "leases"}, Sharded: true,
	}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}
	// An item's term is its slot's epoch; ForItem guards its writes with the spec's election and that term.
	item := itemFrom(&pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a", Term: 42}, &spec)
	var o objectOptions
	ForItem(item)(&o)
	if guard := (&pb.WriteGuard{Election: "web", Namespace: "leases", Term: 42}); o.reconcileLease != "q.1.1" || !proto.Equal(o.guard, guard) {
		t.Errorf("ForItem: lease %q, guard %v; want q.1.1 with %v", o.reconcileLease, o.guard, guard)
	}
	// Without an election it goes as it is: the daemon refuses it, naming spec.sharded.
	req, err = ReconcileSpec{Name: "q", Resource: "configmaps", Sharded: true}.request()
	if err != nil || !req.GetSpec().GetSharded() || req.GetSpec().GetElection() != nil {
		t.Errorf("sharded without an election: %v, %v; want it sent as is", req.GetSpec(), err)
	}
}

func TestAShardedSpecIsSentWithItsShardByAndByKeyWhenZero(t *testing.T) {
	spec := ReconcileSpec{
		Name: "q", Resource: "configmaps", MaxLeases: 4, LeaseTimeout: time.Minute,
		Election: "web", ElectionNamespace: "leases", Sharded: true, ShardBy: ShardByNamespace,
	}
	req, err := spec.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{
		Name: "q", Primary: &pb.ObjectQuery{Resource: "configmaps"}, MaxLeases: 4, LeaseTimeout: durationpb.New(time.Minute),
		Election: &pb.ElectionRef{Election: "web", Namespace: "leases"}, Sharded: true, ShardBy: pb.ShardBy_SHARD_BY_NAMESPACE,
	}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}
	// The zero ShardBy sends none (UNSPECIFIED, by key), the rest unchanged; ShardByKey sends SHARD_BY_KEY.
	spec.ShardBy = 0
	if req, err = spec.request(); err != nil || req.GetSpec().GetShardBy() != pb.ShardBy_SHARD_BY_UNSPECIFIED {
		t.Fatalf("zero ShardBy: %v, %v; want SHARD_BY_UNSPECIFIED", req.GetSpec(), err)
	}
	want.ShardBy = pb.ShardBy_SHARD_BY_UNSPECIFIED
	if !proto.Equal(req.GetSpec(), want) {
		t.Errorf("spec %v, want %v", req.GetSpec(), want)
	}
	spec.ShardBy = ShardByKey
	if req, err = spec.request(); err != nil || req.GetSpec().GetShardBy() != pb.ShardBy_SHARD_BY_KEY {
		t.Errorf("ShardByKey: %v, %v; want SHARD_BY_KEY", req.GetSpec(), err)
	}
	// Without Sharded it goes as it is: the daemon refuses it, naming spec.shard_by.
	req, err = ReconcileSpec{Name: "q", Resource: "configmaps", ShardBy: ShardByNamespace}.request()
	if err != nil || req.GetSpec().GetShardBy() != pb.ShardBy_SHARD_BY_NAMESPACE || req.GetSpec().GetSharded() {
		t.Errorf("shard_by without sharded: %v, %v; want it sent as is", req.GetSpec(), err)
	}
	if got := ShardByNamespace.String(); got != "NAMESPACE" {
		t.Errorf("ShardByNamespace.String() = %q, want NAMESPACE", got)
	}
}

func TestTheSpecCarriesTheViewOfThePrimaryAndOfEachRelatedQueryAndNoneWhenZero(t *testing.T) {
	fields := []string{"spec.replicas", "status.conditions"}
	spec := ReconcileSpec{
		Name: "q", Resource: "apps/v1/deployments", Namespace: "ns",
		View: View{Fields: fields},
		Related: []Related{
			{Resource: "pods", View: View{MetadataOnly: true}, ControllerOwner: true},
			{Resource: "configmaps", View: View{ManagedFields: true}, Label: "owner"},
			{Resource: "secrets", Annotation: "example.com/owner"},
		},
	}
	req, err := spec.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{
		Name:    "q",
		Primary: &pb.ObjectQuery{Resource: "apps/v1/deployments", Namespace: "ns", View: &pb.ObjectView{Fields: fields}},
		Related: []*pb.RelatedQuery{
			{Query: &pb.ObjectQuery{Resource: "pods", View: &pb.ObjectView{MetadataOnly: true}}, MapsBy: &pb.RelatedQuery_ControllerOwner{ControllerOwner: true}},
			{Query: &pb.ObjectQuery{Resource: "configmaps", View: &pb.ObjectView{ManagedFields: true}}, MapsBy: &pb.RelatedQuery_Label{Label: "owner"}},
			{Query: &pb.ObjectQuery{Resource: "secrets"}, MapsBy: &pb.RelatedQuery_Annotation{Annotation: "example.com/owner"}},
		},
		MaxLeases: 1,
	}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}
	// The zero View sends no view at all, so the spec is equal to one of an SDK that knows no views.
	if req.GetSpec().GetRelated()[2].GetQuery().View != nil {
		t.Error("a zero View went out as an empty view")
	}
	// What the sidecar refuses (both set, too many paths) goes as is: it names the field.
	bad := ReconcileSpec{Name: "q", Resource: "configmaps", View: View{MetadataOnly: true, Fields: []string{"data"}}}
	if req, err := bad.request(); err != nil || !req.GetSpec().GetPrimary().GetView().GetMetadataOnly() || len(req.GetSpec().GetPrimary().GetView().GetFields()) != 1 {
		t.Errorf("a view the sidecar refuses was not sent as is: %v, %v", req, err)
	}
}

func TestTheChangesGoOnTheQueryTheyAreAskedOfAndNoneWhenZero(t *testing.T) {
	spec := ReconcileSpec{
		Name: "q", Resource: "apps/v1/deployments", Namespace: "ns",
		Changes: Changes{Generation: true, Labels: true},
		Related: []Related{
			{Resource: "pods", ControllerOwner: true, Changes: Changes{Annotations: true}},
			{Resource: "secrets", Label: "owner"},
		},
	}
	req, err := spec.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{
		Name:    "q",
		Primary: &pb.ObjectQuery{Resource: "apps/v1/deployments", Namespace: "ns", Changes: &pb.ChangeFilter{Generation: true, Labels: true}},
		Related: []*pb.RelatedQuery{
			{Query: &pb.ObjectQuery{Resource: "pods", Changes: &pb.ChangeFilter{Annotations: true}}, MapsBy: &pb.RelatedQuery_ControllerOwner{ControllerOwner: true}},
			{Query: &pb.ObjectQuery{Resource: "secrets"}, MapsBy: &pb.RelatedQuery_Label{Label: "owner"}},
		},
		MaxLeases: 1,
	}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}
	// The zero Changes sends no filter at all (every change), never an empty one, which the daemon refuses.
	if req.GetSpec().GetRelated()[1].GetQuery().Changes != nil {
		t.Error("a zero Changes went out as an empty filter")
	}
	// Each part on its own goes as that part, on the related query as on the primary.
	for _, c := range []struct {
		changes Changes
		want    *pb.ChangeFilter
	}{
		{Changes{Generation: true}, &pb.ChangeFilter{Generation: true}},
		{Changes{Labels: true}, &pb.ChangeFilter{Labels: true}},
		{Changes{Annotations: true}, &pb.ChangeFilter{Annotations: true}},
	} {
		req, err := ReconcileSpec{Name: "q", Resource: "configmaps", Changes: c.changes,
			Related: []Related{{Resource: "secrets", Label: "owner", Changes: c.changes}}}.request()
		if err != nil {
			t.Fatal(err)
		}
		if got := req.GetSpec().GetPrimary().GetChanges(); !proto.Equal(got, c.want) {
			t.Errorf("%+v on the primary: sent %v, want %v", c.changes, got, c.want)
		}
		if got := req.GetSpec().GetRelated()[0].GetQuery().GetChanges(); !proto.Equal(got, c.want) {
			t.Errorf("%+v on a related query: sent %v, want %v", c.changes, got, c.want)
		}
	}
}

func TestTheFinalizerGoesOnTheSpecSentAndNoneWhenUnset(t *testing.T) {
	req, err := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns", Finalizer: "example.com/cleanup"}.request()
	if err != nil {
		t.Fatal(err)
	}
	want := &pb.QueueSpec{Name: "q", Primary: &pb.ObjectQuery{Resource: "configmaps", Namespace: "ns"}, MaxLeases: 1, Finalizer: "example.com/cleanup"}
	if !proto.Equal(req.GetSpec(), want) {
		t.Fatalf("spec %v, want %v", req.GetSpec(), want)
	}
	req, err = ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns"}.request()
	if err != nil {
		t.Fatal(err)
	}
	if got := req.GetSpec().GetFinalizer(); got != "" {
		t.Errorf("a spec without a Finalizer sent finalizer %q, want none", got)
	}
	// One that is not a qualified name goes as it is: the daemon refuses it, naming spec.finalizer.
	req, err = ReconcileSpec{Name: "q", Resource: "configmaps", Finalizer: "cleanup"}.request()
	if err != nil || req.GetSpec().GetFinalizer() != "cleanup" {
		t.Errorf("an unqualified finalizer: %v, %v; want it sent as is", req.GetSpec(), err)
	}
}

func TestAnItemIsFinalizingWhenItsWorkItemIs(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns", Finalizer: "example.com/cleanup"}
	want, _ := spec.request()
	passes := make(chan Item, 4)
	f, _, _ := fakeReconciling(t, spec, func(_ context.Context, item Item) (Result, error) {
		passes <- item
		return Result{}, nil
	})
	q := f.open(t, want.GetSpec())
	for _, finalizing := range []bool{false, true} {
		lease := fmt.Sprintf("q.1.%t", finalizing)
		q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Item{Item: &pb.WorkItem{
			LeaseId: lease, Namespace: "ns", Name: "a", Attempt: 1, Finalizing: finalizing,
			ExpiresAt: timestamppb.New(time.Now().Add(time.Minute)),
		}}})
		select {
		case item := <-passes:
			if item.LeaseID != lease || item.Finalizing != finalizing {
				t.Errorf("the pass of lease %s was handed %s with Finalizing %t, want %t", lease, item.LeaseID, item.Finalizing, finalizing)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no pass of lease %s within 5 s", lease)
		}
		// Returning success completes it DONE, which for a finalize pass removes the finalizer.
		if c := q.next(t).GetComplete(); c.GetLeaseId() != lease || c.GetOutcome() != pb.Outcome_OUTCOME_DONE {
			t.Errorf("completion %v, want DONE of %s", c, lease)
		}
	}
}

// leaseRecorder is an objects service that keeps every write's reconcile_lease and guard.
type leaseRecorder struct {
	pb.ObjectsServiceClient
	mu     sync.Mutex
	leases []string
	guards []*pb.WriteGuard
}

func (f *leaseRecorder) keep(lease string, guard *pb.WriteGuard) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases, f.guards = append(f.leases, lease), append(f.guards, guard)
}

func (f *leaseRecorder) Create(_ context.Context, r *pb.CreateRequest, _ ...grpc.CallOption) (*pb.CreateResponse, error) {
	f.keep(r.GetReconcileLease(), r.GetGuard())
	return &pb.CreateResponse{}, nil
}

func (f *leaseRecorder) Update(_ context.Context, r *pb.UpdateRequest, _ ...grpc.CallOption) (*pb.UpdateResponse, error) {
	f.keep(r.GetReconcileLease(), r.GetGuard())
	return &pb.UpdateResponse{}, nil
}

func (f *leaseRecorder) Patch(_ context.Context, r *pb.PatchRequest, _ ...grpc.CallOption) (*pb.PatchResponse, error) {
	f.keep(r.GetReconcileLease(), r.GetGuard())
	return &pb.PatchResponse{}, nil
}

func (f *leaseRecorder) Delete(_ context.Context, r *pb.DeleteRequest, _ ...grpc.CallOption) (*pb.DeleteResponse, error) {
	f.keep(r.GetReconcileLease(), r.GetGuard())
	return &pb.DeleteResponse{}, nil
}

func TestEveryWriteForAnItemNamesItsLeaseAndWithAnElectionCarriesItsTerm(t *testing.T) {
	objects := &leaseRecorder{}
	c := &Client{objects: objects, writes: newOwnWrites()}
	ctx := context.Background()
	writeAll := func(opt ObjectOption) {
		t.Helper()
		for _, err := range []error{
			func() error { _, err := c.Create(ctx, "configmaps", "ns", []byte(`{}`), opt); return err }(),
			func() error { _, err := c.Update(ctx, "configmaps", "ns", "a", []byte(`{}`), opt); return err }(),
			func() error {
				_, err := c.Patch(ctx, "configmaps", "ns", "a", MergePatch, []byte(`{}`), opt)
				return err
			}(),
			func() error { _, err := c.Delete(ctx, "configmaps", "ns", "a", opt); return err }(),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := ReconcileSpec{Name: "q", Election: "lead", ElectionNamespace: "ns"}
	led := itemFrom(&pb.WorkItem{LeaseId: "q.1.7", Namespace: "ns", Name: "a", Term: 3}, &spec)
	writeAll(ForItem(led))
	writeAll(WithReconcileLease("q.1.8"))
	unled := itemFrom(&pb.WorkItem{LeaseId: "q.1.9", Namespace: "ns", Name: "a"}, &ReconcileSpec{Name: "q"})
	writeAll(ForItem(unled))

	guard := &pb.WriteGuard{Election: "lead", Namespace: "ns", Term: 3}
	for i, lease := range objects.leases {
		want, wantGuard := []string{"q.1.7", "q.1.8", "q.1.9"}[i/4], []*pb.WriteGuard{guard, nil, nil}[i/4]
		if lease != want || !proto.Equal(objects.guards[i], wantGuard) {
			t.Errorf("write %d named lease %q with guard %v, want %q with %v", i, lease, objects.guards[i], want, wantGuard)
		}
	}
	if len(objects.leases) != 12 {
		t.Fatalf("%d writes recorded, want 12", len(objects.leases))
	}
}

// fakeQueue is one Reconcile stream: the test reads what the SDK sent and writes what the sidecar
// answers, or cuts it.
type fakeQueue struct {
	grpc.ClientStream
	ctx       context.Context
	sent      chan *pb.ReconcileRequest
	answers   chan *pb.ReconcileResponse
	cutOnce   sync.Once
	cutReason chan error
}

func (q *fakeQueue) Send(m *pb.ReconcileRequest) error {
	select {
	case <-q.cutReason:
		return io.EOF
	default:
	}
	select {
	case q.sent <- m:
		return nil
	case <-q.ctx.Done():
		return io.EOF
	}
}

func (q *fakeQueue) Recv() (*pb.ReconcileResponse, error) {
	select {
	case a := <-q.answers:
		return a, nil
	case <-q.cutReason:
		return nil, status.Error(codes.Unavailable, "the fake cut the stream")
	case <-q.ctx.Done():
		return nil, status.FromContextError(q.ctx.Err()).Err()
	}
}

// cut breaks the stream as a lost connection does.
func (q *fakeQueue) cut() { q.cutOnce.Do(func() { close(q.cutReason) }) }

// answer sends the SDK one response.
func (q *fakeQueue) answer(r *pb.ReconcileResponse) { q.answers <- r }

func (q *fakeQueue) grant(lease, name string) {
	expires := timestamppb.New(time.Now().Add(time.Minute))
	q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Item{Item: &pb.WorkItem{LeaseId: lease, Namespace: "ns", Name: name, Attempt: 1, ExpiresAt: expires}}})
}

// next is the next request the SDK sent on this stream.
func (q *fakeQueue) next(t *testing.T) *pb.ReconcileRequest {
	t.Helper()
	select {
	case m := <-q.sent:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("nothing sent on the stream within 5 s")
	}
	panic("unreachable")
}

// quiet fails if the SDK sends anything on this stream within d.
func (q *fakeQueue) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case m := <-q.sent:
		t.Fatalf("unexpected request %v", m)
	case <-time.After(d):
	}
}

// fakeReconcile hands every stream the SDK opens to the test; refuse, when set, is the answer to the spec
// instead of STARTED.
type fakeReconcile struct {
	opened chan *fakeQueue
	refuse error
}

func (f *fakeReconcile) Reconcile(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[pb.ReconcileRequest, pb.ReconcileResponse], error) {
	q := &fakeQueue{ctx: ctx, sent: make(chan *pb.ReconcileRequest, 64), answers: make(chan *pb.ReconcileResponse, 64), cutReason: make(chan error)}
	select {
	case f.opened <- q:
		return refusingQueue{q, f.refuse}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// refusingQueue answers its first Recv with the refusal, when there is one.
type refusingQueue struct {
	*fakeQueue
	refuse error
}

func (q refusingQueue) Recv() (*pb.ReconcileResponse, error) {
	if q.refuse != nil {
		return nil, q.refuse
	}
	return q.fakeQueue.Recv()
}

// open waits for the SDK's next stream and answers its spec with STARTED.
func (f *fakeReconcile) open(t *testing.T, want *pb.QueueSpec) *fakeQueue {
	t.Helper()
	select {
	case q := <-f.opened:
		if got := q.next(t).GetSpec(); !proto.Equal(got, want) {
			t.Fatalf("the stream opened with spec %v, want %v", got, want)
		}
		q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Started{Started: &pb.QueueStarted{Name: want.GetName()}}})
		return q
	case <-time.After(5 * time.Second):
		t.Fatal("no stream opened within 5 s")
	}
	panic("unreachable")
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// fakeReconciling runs Reconcile against a fake until the test ends; it returns the fake, the log and
// Reconcile's result.
func fakeReconciling(t *testing.T, spec ReconcileSpec, r ReconcilerFunc) (*fakeReconcile, *syncBuffer, <-chan error) {
	return fakeReconcilingWith(t, nil, spec, r)
}

// fakeReconcilingWith is fakeReconciling with objects as the client's objects service (nil: none).
func fakeReconcilingWith(t *testing.T, objects pb.ObjectsServiceClient, spec ReconcileSpec, r ReconcilerFunc) (*fakeReconcile, *syncBuffer, <-chan error) {
	f := &fakeReconcile{opened: make(chan *fakeQueue, 8)}
	log := &syncBuffer{}
	c := &Client{reconcile: f, objects: objects, writes: newOwnWrites(), log: slog.New(slog.NewTextHandler(log, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Reconcile(ctx, spec, r) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Reconcile did not return within 5 s of its ctx ending")
		}
	})
	return f, log, done
}

// passesOnAFakeQueue runs Reconcile on spec against a fake stream and objects (fakeReconcilingWith), pass
// as every pass, and returns the stream, opened with spec and answered STARTED, to hand items out on
// (handOut).
func passesOnAFakeQueue(t *testing.T, spec ReconcileSpec, objects pb.ObjectsServiceClient, pass ReconcilerFunc) *fakeQueue {
	t.Helper()
	f, _, _ := fakeReconcilingWith(t, objects, spec, pass)
	want, err := spec.request()
	if err != nil {
		t.Fatal(err)
	}
	return f.open(t, want.GetSpec())
}

// afterALostConnection is a reconciler whose first pass (lease q.1.1 of key a) ignores the end of its ctx
// until release is closed, after its stream was cut. Every pass started is sent on started; overlaps
// counts the passes that started while another pass of their key ran, most the most passes that ran at
// once.
type afterALostConnection struct {
	second   *fakeQueue
	started  chan string
	release  chan struct{}
	mu       sync.Mutex
	keys     map[string]int
	overlaps int
	running  int
	most     int
}

// loseTheConnection starts that reconciler, cuts its first stream under its first pass and returns once
// the second stream is open.
func loseTheConnection(t *testing.T, maxLeases int) *afterALostConnection {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns", MaxLeases: maxLeases}
	want, _ := spec.request()
	s := &afterALostConnection{started: make(chan string, 16), release: make(chan struct{}), keys: map[string]int{}}
	cancelled := make(chan string, 16)
	f, _, _ := fakeReconciling(t, spec, func(ctx context.Context, item Item) (Result, error) {
		s.mu.Lock()
		if s.keys[item.Name]++; s.keys[item.Name] > 1 {
			s.overlaps++
		}
		s.running++
		s.most = max(s.most, s.running)
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			s.keys[item.Name]--
			s.running--
			s.mu.Unlock()
		}()
		s.started <- item.LeaseID
		if item.LeaseID == "q.1.1" {
			<-ctx.Done() // the lease went with the stream
			cancelled <- item.LeaseID
			<-s.release // but this pass takes its time to return
		}
		return Result{}, nil
	})
	t.Cleanup(func() {
		select {
		case <-s.release:
		default:
			close(s.release)
		}
	})
	first := f.open(t, want.GetSpec())
	first.grant("q.1.1", "a")
	expectValue(t, s.started, "q.1.1", "the first pass")
	first.cut()
	expectValue(t, cancelled, "q.1.1", "the first pass's ctx ending with its stream")
	s.second = f.open(t, want.GetSpec())
	return s
}

// notStarted fails if a pass starts within 300 ms.
func (s *afterALostConnection) notStarted(t *testing.T, why string) {
	t.Helper()
	select {
	case lease := <-s.started:
		t.Fatalf("pass %s started %s", lease, why)
	case <-time.After(300 * time.Millisecond):
	}
}

// completed expects DONE for exactly these leases on the second stream (never the old stream's q.1.1).
func (s *afterALostConnection) completed(t *testing.T, want ...string) {
	t.Helper()
	leases := map[string]bool{}
	for range want {
		c := s.second.next(t).GetComplete()
		if c.GetOutcome() != pb.Outcome_OUTCOME_DONE {
			t.Fatalf("completion %v, want DONE", c)
		}
		leases[c.GetLeaseId()] = true
	}
	for _, lease := range want {
		if !leases[lease] {
			t.Fatalf("completed %v on the new stream, want %v", leases, want)
		}
	}
	s.second.quiet(t, 200*time.Millisecond)
}

func TestAfterALostConnectionAKeyHandedOutAgainWaitsForItsOldPassWhoseCompletionIsDropped(t *testing.T) {
	s := loseTheConnection(t, 2)
	s.second.grant("q.2.1", "a") // the key again, its old pass still running
	s.second.grant("q.2.2", "b") // another key: the second slot is free
	expectValue(t, s.started, "q.2.2", "another key's pass beside the old one")
	s.notStarted(t, "while the old pass of a ran")
	close(s.release)
	expectValue(t, s.started, "q.2.1", "a's pass once its old one returned")
	s.completed(t, "q.2.1", "q.2.2")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.overlaps != 0 {
		t.Fatalf("%d passes started while another pass of their key ran", s.overlaps)
	}
}

func TestAfterALostConnectionNoMoreThanMaxLeasesPassesRunAtOnce(t *testing.T) {
	s := loseTheConnection(t, 1)
	s.second.grant("q.2.1", "b")
	s.notStarted(t, "while the old pass held the only slot (MaxLeases 1)")
	close(s.release)
	expectValue(t, s.started, "q.2.1", "b's pass once the slot was free")
	s.completed(t, "q.2.1")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.most != 1 {
		t.Fatalf("%d passes ran at once with MaxLeases 1", s.most)
	}
}

func expectValue(t *testing.T, ch <-chan string, want, what string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("%s: %s, want %s", what, got, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: nothing within 5 s", what)
	}
}

func TestARefusedCompletionIsLoggedAndTheWorkGoesOn(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns", MaxLeases: 2}
	want, _ := spec.request()
	f, log, done := fakeReconciling(t, spec, func(ctx context.Context, item Item) (Result, error) {
		return Result{}, nil
	})
	q := f.open(t, want.GetSpec())
	q.grant("q.1.1", "a")
	if c := q.next(t).GetComplete(); c.GetLeaseId() != "q.1.1" {
		t.Fatalf("completion %v, want q.1.1's", c)
	}
	q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Refused{Refused: &pb.CompletionRefused{
		LeaseId: "q.1.1", Refusal: &pb.Refusal{Code: int32(codes.FailedPrecondition), Message: "complete.lease_id: no such lease"},
	}}})
	q.grant("q.1.2", "b")
	if c := q.next(t).GetComplete(); c.GetLeaseId() != "q.1.2" {
		t.Fatalf("completion %v, want q.1.2's", c)
	}
	select {
	case err := <-done:
		t.Fatalf("Reconcile returned %v after a refused completion", err)
	default:
	}
	for _, want := range []string{"refused a reconcile completion", "lease=q.1.1", "code=FailedPrecondition", "complete.lease_id: no such lease"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
}

func TestARefusedSpecEndsReconcileWithTheStatusUnchanged(t *testing.T) {
	f := &fakeReconcile{opened: make(chan *fakeQueue, 8), refuse: status.Error(codes.FailedPrecondition, "spec: the queue runs with another spec")}
	c := &Client{reconcile: f, writes: newOwnWrites()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := c.Reconcile(ctx, ReconcileSpec{Name: "q", Resource: "configmaps"}, ReconcilerFunc(func(context.Context, Item) (Result, error) {
		t.Error("reconciled with a refused spec")
		return Result{}, nil
	}))
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || s.Message() != "spec: the queue runs with another spec" {
		t.Fatalf("Reconcile returned %v, want the refusal unchanged", err)
	}
	if len(f.opened) != 1 {
		t.Fatalf("%d streams opened, want 1 (a refusal is not retried)", len(f.opened))
	}
}

func TestAPanicIsRecoveredAsAnError(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns"}
	want, _ := spec.request()
	f, log, _ := fakeReconciling(t, spec, func(ctx context.Context, item Item) (Result, error) {
		panic("oops")
	})
	q := f.open(t, want.GetSpec())
	q.grant("q.1.1", "a")
	c := q.next(t).GetComplete()
	if c.GetOutcome() != pb.Outcome_OUTCOME_RETRY || c.GetError() != "panic: oops [recovered]" {
		t.Fatalf("completion %v, want RETRY with the panic", c)
	}
	if !strings.Contains(log.String(), "panicked") {
		t.Fatalf("the panic is not logged:\n%s", log)
	}
}

func TestCancellingReconcileWaitsForItsPassesAndReturnsTheContextsError(t *testing.T) {
	f := &fakeReconcile{opened: make(chan *fakeQueue, 8)}
	c := &Client{reconcile: f, writes: newOwnWrites()}
	ctx, cancel := context.WithCancel(context.Background())
	started, returned := make(chan struct{}), make(chan struct{})
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns"}
	want, _ := spec.request()
	done := make(chan error, 1)
	go func() {
		done <- c.Reconcile(ctx, spec, ReconcilerFunc(func(ctx context.Context, item Item) (Result, error) {
			close(started)
			<-ctx.Done()
			time.Sleep(100 * time.Millisecond)
			close(returned)
			return Result{}, nil
		}))
	}()
	q := f.open(t, want.GetSpec())
	q.grant("q.1.1", "a")
	<-started
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Reconcile returned %v, want context.Canceled", err)
		}
		select {
		case <-returned:
		default:
			t.Fatal("Reconcile returned before its running pass did")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Reconcile did not return within 5 s of its ctx ending")
	}
}

func TestAPassPastItsLeaseHasItsCtxEndedAndItsOutcomeDroppedAndLogged(t *testing.T) {
	spec := ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "ns"}
	want, _ := spec.request()
	ended := make(chan error, 1)
	f, log, _ := fakeReconciling(t, spec, func(ctx context.Context, item Item) (Result, error) {
		<-ctx.Done()
		ended <- ctx.Err()
		return Result{}, errors.New("too late")
	})
	q := f.open(t, want.GetSpec())
	expires := time.Now().Add(200 * time.Millisecond)
	q.answer(&pb.ReconcileResponse{Response: &pb.ReconcileResponse_Item{Item: &pb.WorkItem{LeaseId: "q.1.1", Namespace: "ns", Name: "a", ExpiresAt: timestamppb.New(expires)}}})
	select {
	case err := <-ended:
		if !errors.Is(err, context.DeadlineExceeded) || time.Now().Before(expires) {
			t.Fatalf("the pass's ctx ended with %v at %s, want DeadlineExceeded at the lease's expiry %s", err, time.Now(), expires)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pass's ctx did not end when its lease expired")
	}
	q.quiet(t, 200*time.Millisecond)
	if !strings.Contains(log.String(), "lease timed out while its pass ran") || !strings.Contains(log.String(), "lease=q.1.1") {
		t.Fatalf("the log does not say the lease timed out:\n%s", log)
	}
}
