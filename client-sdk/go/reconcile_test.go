// Tests of the reconciler against the daemons: each key once, one more pass for a change during a pass,
// never two passes of a key at once (also across a lost connection), retries, requeues, terminal errors,
// a pass seeing what the pass before it wrote under its lease, a change filter, refused specs, and a daemon
// restart.

package consistd_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// pass is one call of a test's reconciler.
type pass struct {
	item  consistd.Item
	start time.Time
}

// passes records a reconciler's passes: each as it starts, and every time two passes of one key ran at once.
type passes struct {
	t        *testing.T
	mu       sync.Mutex
	running  map[string]int
	overlaps []string
	count    map[string]int
	started  chan pass
}

// recording wraps handle so that every pass is recorded before handle runs.
func recording(t *testing.T, handle consistd.ReconcilerFunc) (*passes, consistd.ReconcilerFunc) {
	p := &passes{t: t, running: map[string]int{}, count: map[string]int{}, started: make(chan pass, 1024)}
	return p, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		key := item.String()
		p.mu.Lock()
		p.running[key]++
		if p.running[key] > 1 {
			p.overlaps = append(p.overlaps, fmt.Sprintf("%s (lease %s, attempt %d)", key, item.LeaseID, item.Attempt))
		}
		p.count[key]++
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			p.running[key]--
			p.mu.Unlock()
		}()
		p.started <- pass{item: item, start: time.Now()}
		return handle(ctx, item)
	}
}

// next is the next pass to start, failing the test after waitFor.
func (p *passes) next() pass {
	p.t.Helper()
	select {
	case s := <-p.started:
		p.t.Logf("pass of %s: attempt %d, lease %s, %s, last error %q", s.item, s.item.Attempt, s.item.LeaseID, s.item.Consistency, s.item.LastError)
		return s
	case <-time.After(waitFor):
		p.t.Fatalf("no reconcile pass within %s", waitFor)
	}
	panic("unreachable")
}

// quiet fails the test if a pass starts within d.
func (p *passes) quiet(d time.Duration) {
	p.t.Helper()
	select {
	case s := <-p.started:
		p.t.Fatalf("unexpected pass of %s (attempt %d, lease %s)", s.item, s.item.Attempt, s.item.LeaseID)
	case <-time.After(d):
	}
}

// noOverlaps fails the test if two passes of one key ever ran at once.
func (p *passes) noOverlaps() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.overlaps) > 0 {
		p.t.Fatalf("passes started while another pass of their key ran: %v", p.overlaps)
	}
}

// reconciling runs c.Reconcile until the test ends (or stop is called); done gives what it returned.
func reconciling(t *testing.T, c *consistd.Client, spec consistd.ReconcileSpec, r consistd.Reconciler) (stop func() error, done <-chan error) {
	ctx, cancel := context.WithCancel(testContext(t))
	result := make(chan error, 1)
	go func() { result <- c.Reconcile(ctx, spec, r) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-result:
			case <-time.After(waitFor):
				t.Errorf("Reconcile did not return within %s of its ctx ending", waitFor)
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop, result
}

// releaseAtTheEnd closes release, if the test has not, before Reconcile is stopped (registered after
// reconciling), so a pass held on it does not keep Reconcile from returning after a failure.
func releaseAtTheEnd(t *testing.T, release chan struct{}) {
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
}

// queueSpec reconciles the test's ConfigMaps in ns.
func queueSpec(prefix, ns string) consistd.ReconcileSpec {
	return consistd.ReconcileSpec{Name: unique(prefix), Resource: "configmaps", Namespace: ns, LabelSelector: testLabel}
}

// data is the item's ConfigMap data (nil, failing the test, without one). It may run in a pass, so it
// never stops the goroutine.
func data(t *testing.T, item consistd.Item) map[string]string {
	t.Helper()
	var cm struct{ Data map[string]string }
	if item.Object == nil {
		t.Errorf("the item %s has no object", item)
		return nil
	}
	if err := item.Object.Decode(&cm); err != nil {
		t.Errorf("decoding %s: %v", item, err)
	}
	return cm.Data
}

func patchData(t *testing.T, c *consistd.Client, ns, name, key, value string, opts ...consistd.ObjectOption) *consistd.Object {
	t.Helper()
	obj, err := c.Patch(testContext(t), "configmaps", ns, name, consistd.MergePatch, map[string]any{"data": map[string]string{key: value}}, opts...)
	if err != nil {
		t.Fatalf("patching %s/%s: %v", ns, name, err)
	}
	return obj
}

func TestReconcileHandsOutEachKeyOnceAndAChangeDuringAPassGivesExactlyOneMore(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	for _, name := range []string{"a", "b", "c"} {
		mustCreate(t, c, ns, name)
	}
	release := make(chan struct{})
	var rec *passes
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		if item.Name == "a" && data(t, item)["k"] == "v" {
			<-release // a's first pass runs while the test changes a
		}
		return consistd.Result{}, nil
	})
	spec := queueSpec("go-once", ns)
	spec.MaxLeases = 3
	stop, _ := reconciling(t, c, spec, handler)
	releaseAtTheEnd(t, release)

	first := map[string]bool{}
	for range 3 {
		p := rec.next()
		if p.item.Namespace != ns || p.item.Attempt != 1 || p.item.Consistency != consistd.Consistent || p.item.LeaseID == "" ||
			p.item.Object == nil || p.item.Object.Name != p.item.Name || p.item.ExpiresAt.Before(time.Now()) {
			t.Fatalf("first pass %+v: want attempt 1, CONSISTENT, a lease, the object and a lease expiring later", p.item)
		}
		first[p.item.Name] = true
	}
	if !maps.Equal(first, map[string]bool{"a": true, "b": true, "c": true}) {
		t.Fatalf("first passes of %v, want a, b and c once each", slices.Sorted(maps.Keys(first)))
	}

	// Three changes to a while its pass runs: no pass meanwhile, then exactly one, of the latest state.
	for v := range 3 {
		patchData(t, c, ns, "a", "k", strconv.Itoa(v+1))
	}
	rec.quiet(time.Second)
	close(release)
	again := rec.next()
	if again.item.Name != "a" || data(t, again.item)["k"] != "3" {
		t.Fatalf("after a's pass: a pass of %s with data %v, want a with k=3", again.item, again.item.Object)
	}
	rec.quiet(2 * time.Second)
	rec.noOverlaps()
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reconcile returned %v when its ctx was cancelled, want context.Canceled", err)
	}
}

func TestReconcileNeverRunsTwoPassesOfAKeyAtOnceAcrossALostConnection(t *testing.T) {
	p := startProxy(t, env(t, "CONSISTD_SOCKET"))
	c := ready(t, p.Socket)
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "a")
	cancelled, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		first := false
		once.Do(func() { first = true })
		if first {
			<-ctx.Done() // the lease went with the connection ...
			close(cancelled)
			<-release // ... but the pass takes its time to return
		}
		return consistd.Result{}, nil
	})
	spec := queueSpec("go-cut", ns)
	spec.MaxLeases = 2 // a free slot: the key's own rule is what holds its next pass
	reconciling(t, c, spec, handler)
	releaseAtTheEnd(t, release)
	rec.next()

	connections := p.connections()
	p.cut()
	select {
	case <-cancelled:
	case <-time.After(waitFor):
		t.Fatalf("the pass's ctx did not end within %s of the connection being lost", waitFor)
	}
	deadline := time.Now().Add(waitFor)
	for p.connections() == connections {
		if time.Now().After(deadline) {
			t.Fatalf("the SDK did not connect again within %s", waitFor)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The daemon hands a to the new stream at once; its pass waits for the old one.
	rec.quiet(1500 * time.Millisecond)
	close(release)
	if again := rec.next(); again.item.Name != "a" {
		t.Fatalf("after the old pass returned: a pass of %s, want a", again.item)
	}
	rec.noOverlaps()
}

func TestReconcileAnErrorComesBackWithTheNextAttemptAndTheError(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "a")
	var failed time.Time
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		if item.Attempt == 1 {
			failed = time.Now()
			return consistd.Result{RequeueAfter: time.Hour}, errors.New("the backend said no") // the error wins
		}
		return consistd.Result{}, nil
	})
	spec := queueSpec("go-retry", ns)
	spec.Retry = consistd.RetryPolicy{BaseDelay: 200 * time.Millisecond}
	reconciling(t, c, spec, handler)
	rec.next()
	second := rec.next()
	if second.item.Attempt != 2 || second.item.LastError != "the backend said no" {
		t.Fatalf("after an error: attempt %d, last error %q; want 2, \"the backend said no\"", second.item.Attempt, second.item.LastError)
	}
	if waited := second.start.Sub(failed); waited < 200*time.Millisecond {
		t.Fatalf("the retry came %s after the error, before its 200 ms backoff", waited)
	}
	rec.quiet(time.Second)
}

func TestReconcileRequeueAfterComesBackAfterTheDelay(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "a")
	var returned time.Time
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		if returned.IsZero() {
			returned = time.Now()
			return consistd.Result{RequeueAfter: 300 * time.Millisecond}, nil
		}
		return consistd.Result{}, nil
	})
	reconciling(t, c, queueSpec("go-requeue", ns), handler)
	rec.next()
	again := rec.next()
	if waited := again.start.Sub(returned); waited < 300*time.Millisecond {
		t.Fatalf("requeued after 300 ms, but the next pass came after %s", waited)
	}
	if again.item.Name != "a" || again.item.LastError != "" {
		t.Fatalf("the requeued pass: %s, last error %q", again.item, again.item.LastError)
	}
	rec.quiet(time.Second)
}

func TestReconcileATerminalErrorWaitsForAChange(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "a")
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		if data(t, item)["k"] == "v" {
			return consistd.Result{}, fmt.Errorf("checking: %w", consistd.TerminalError(errors.New("the spec cannot work")))
		}
		return consistd.Result{}, nil
	})
	spec := queueSpec("go-terminal", ns)
	spec.Retry = consistd.RetryPolicy{BaseDelay: 10 * time.Millisecond}
	reconciling(t, c, spec, handler)
	rec.next()
	rec.quiet(1500 * time.Millisecond) // a retry would have come after 10 ms
	patchData(t, c, ns, "a", "k", "fixed")
	if again := rec.next(); data(t, again.item)["k"] != "fixed" {
		t.Fatalf("after the change: a pass with %v, want k=fixed", again.item.Object)
	}
	rec.quiet(time.Second)
}

func TestReconcileAQueueFilteringOnLabelsHandsOutALabelChangeAndNotADataChange(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "a")
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		return consistd.Result{}, nil
	})
	spec := queueSpec("go-changes", ns)
	spec.Changes = consistd.Changes{Labels: true}
	reconciling(t, c, spec, handler)
	if first := rec.next(); first.item.Name != "a" {
		t.Fatalf("first pass of %s, want a: an object's first state is handed out", first.item)
	}
	// A change of the data, which the filter does not name: nothing.
	patchData(t, c, ns, "a", "k", "changed")
	rec.quiet(2 * time.Second)
	// A change of a label: handed out, with the state that has it.
	labelled := map[string]any{"metadata": map[string]any{"labels": map[string]string{"tier": "web"}}}
	if _, err := c.Patch(testContext(t), "configmaps", ns, "a", consistd.MergePatch, labelled); err != nil {
		t.Fatalf("labelling %s/a: %v", ns, err)
	}
	again := rec.next()
	var cm struct {
		Metadata struct{ Labels map[string]string }
	}
	if again.item.Object != nil {
		if err := again.item.Object.Decode(&cm); err != nil {
			t.Fatalf("decoding %s: %v", again.item, err)
		}
	}
	if again.item.Name != "a" || cm.Metadata.Labels["tier"] != "web" {
		t.Fatalf("after a label change: a pass of %s with labels %v, want a labelled tier=web", again.item, cm.Metadata.Labels)
	}
	rec.quiet(time.Second)
}

// The promise of ForItem: a write a pass makes to a related object, naming its lease, is in the daemon's
// cache before the key's next pass, although that pass is asked for at once (RequeueAfter 1 ms) and the
// daemon's watches get every event 300 ms late while a write's answer comes at once. The primary is a
// Secret: the daemon holds a lease's write for every watch of the queue on the written resource and
// namespace, whatever its selectors, and a primary watch of ConfigMaps that never sees the child would
// hold each pass until the consistency timeout.
func TestReconcileAPassSeesWhatThePassBeforeWroteUnderItsLease(t *testing.T) {
	slow := startWatchDelayProxy(t, 300*time.Millisecond)
	d := startDaemonWith(t, slow.Kubeconfig, "sdk-go-lease", "consistency:", "  timeout: 10s")
	c := ready(t, d.Socket)
	setup := ready(t, "")
	ns := freshNamespace(t, setup)
	if _, err := setup.Create(testContext(t), "secrets", ns, map[string]any{"metadata": map[string]any{"name": "p"}}); err != nil {
		t.Fatal(err)
	}
	child := configMap("p-child", map[string]string{"round": "0"})
	child["metadata"].(map[string]any)["labels"] = map[string]string{"sdk.consistd.io/test": "go", "parent": "p"}
	if _, err := setup.Create(testContext(t), "configmaps", ns, child); err != nil {
		t.Fatal(err)
	}
	// The queue's ConfigMap watch is the daemon's shared one for this query: once it has synced, Get
	// reads from its cache.
	watch(t, c, consistd.WatchRequest{Resource: "configmaps", Namespace: ns}).initialState()
	const rounds = 8
	var (
		mu         sync.Mutex
		round      int
		written    uint64
		violations []string
	)
	finished := make(chan struct{})
	_, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		if round > rounds {
			return consistd.Result{}, nil
		}
		if written != 0 {
			// From the cache of the queue's ConfigMap watch: no selector, the namespace covered.
			seen, err := c.Get(ctx, "configmaps", ns, "p-child")
			if err != nil {
				return consistd.Result{}, err
			}
			if rv, _ := strconv.ParseUint(seen.ResourceVersion, 10, 64); rv < written {
				violations = append(violations, fmt.Sprintf("pass %d (%s): the child at %d, but the pass before wrote %d", round+1, item.Consistency, rv, written))
			}
		}
		if round++; round > rounds {
			close(finished)
			return consistd.Result{}, nil
		}
		obj, err := c.Patch(ctx, "configmaps", ns, "p-child", consistd.MergePatch, map[string]any{"data": map[string]string{"round": strconv.Itoa(round)}}, consistd.ForItem(item))
		if err != nil {
			return consistd.Result{}, err
		}
		written, _ = strconv.ParseUint(obj.ResourceVersion, 10, 64)
		return consistd.Result{RequeueAfter: time.Millisecond}, nil
	})
	spec := consistd.ReconcileSpec{
		Name: unique("go-lease"), Resource: "secrets", Namespace: ns,
		Related: []consistd.Related{{Resource: "configmaps", Namespace: ns, Label: "parent"}},
	}
	reconciling(t, c, spec, handler)
	select {
	case <-finished:
	case <-time.After(waitFor):
		t.Fatalf("%d rounds not done within %s", rounds, waitFor)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(violations) > 0 {
		t.Fatalf("a pass read a state older than the write of the pass before it:\n%s", strings.Join(violations, "\n"))
	}
}

func TestReconcileABadSpecEndsItWithTheDaemonsStatusNamingTheField(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	good := func() consistd.ReconcileSpec { return queueSpec("go-bad", ns) }
	for _, bad := range []struct {
		change func(*consistd.ReconcileSpec)
		code   codes.Code
		field  string
	}{
		{func(s *consistd.ReconcileSpec) { s.Name = "Not_A_Label" }, codes.InvalidArgument, "spec.name"},
		{func(s *consistd.ReconcileSpec) { s.MaxLeases = 10001 }, codes.InvalidArgument, "spec.max_leases"},
		{func(s *consistd.ReconcileSpec) { s.MaxLeases = -1 }, codes.InvalidArgument, "spec.max_leases"},
		{func(s *consistd.ReconcileSpec) { s.LeaseTimeout = time.Millisecond }, codes.InvalidArgument, "spec.lease_timeout"},
		{func(s *consistd.ReconcileSpec) { s.Related = []consistd.Related{{Resource: "configmaps"}} }, codes.InvalidArgument, "spec.related[0].maps_by"},
		{func(s *consistd.ReconcileSpec) { s.Resource = "nosuchthings" }, codes.NotFound, "spec.primary"},
	} {
		spec := good()
		bad.change(&spec)
		ctx, cancel := context.WithTimeout(testContext(t), 10*time.Second)
		err := c.Reconcile(ctx, spec, consistd.ReconcilerFunc(func(context.Context, consistd.Item) (consistd.Result, error) {
			t.Errorf("%s: a pass ran under a refused spec", bad.field)
			return consistd.Result{}, nil
		}))
		cancel()
		s := status.Convert(err)
		if s.Code() != bad.code || !strings.HasPrefix(s.Message(), bad.field+": ") {
			t.Errorf("spec with a bad %s: Reconcile returned %v, want %s naming the field", bad.field, err, bad.code)
		}
	}
}

func TestReconcileKeepsGoingWhenTheDaemonIsKilledAndStartedAgain(t *testing.T) {
	d := startDaemon(t, "sdk-go-reconcile")
	c := ready(t, d.Socket)
	shared := ready(t, "")
	ns := freshNamespace(t, shared)
	mustCreate(t, shared, ns, "before")
	rec, handler := recording(t, func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		return consistd.Result{}, nil
	})
	_, done := reconciling(t, c, queueSpec("go-restart", ns), handler)
	if p := rec.next(); p.item.Name != "before" {
		t.Fatalf("first pass of %s, want before", p.item)
	}

	d.kill()
	d.start()
	mustCreate(t, shared, ns, "after")
	for {
		p := rec.next() // the restarted daemon lists every key again: "before" may come first
		if p.item.Name == "after" {
			break
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Reconcile returned %v across the restart", err)
	default:
	}
	rec.noOverlaps()
}
