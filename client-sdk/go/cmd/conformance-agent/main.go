// Command conformance-agent is the Go SDK's agent for the SDK conformance suite: it serves the agent
// protocol of client-sdk/conformance/README.md with one consistd.Client on CONSISTD_SOCKET.
//
// Commands come one JSON object a line on standard input; each is handled on a goroutine of its own and
// answered with one JSON line on standard output, where the watches, campaigns and reconcilers it starts
// print their items too. The agent uses the SDK's public API only, as an app would, and exits 0 when
// standard input closes. Everything else it has to say goes to standard error.
//
//	hack/sdk/go.sh conformance
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("conformance agent: ")
	client, err := consistd.New()
	if err != nil {
		log.Fatal(err)
	}
	// The client is never closed: the agent exits when its input ends, which ends every call, and a call
	// still running should not print an answer (CANCELLED) the suite never asked to see.
	a := &agent{
		client:   client,
		out:      bufio.NewWriter(os.Stdout),
		sent:     map[string]*consistd.Sent{},
		paused:   map[string]*pausedWatch{},
		handlers: map[handlerKey]chan handleCommand{},
		latest:   map[string]*consistd.Latest{},
		held:     map[workerKey]*consistd.Taken{},
	}
	if err := a.serve(context.Background(), os.Stdin); err != nil {
		log.Fatalf("reading commands: %v", err)
	}
}

// agent is what the agent keeps between commands.
type agent struct {
	client *consistd.Client

	// outMu serializes the lines written to out, so lines of concurrent commands never interleave.
	outMu sync.Mutex
	out   *bufio.Writer

	// mu guards sent, paused, handlers, latest and held.
	mu sync.Mutex
	// sent is each send's result by message id, for outcome.
	sent map[string]*consistd.Sent
	// paused are the watches started with take false, by stream name.
	paused map[string]*pausedWatch
	// handlers are the reconcile passes waiting for their handle, by reconcile stream and item name.
	handlers map[handlerKey]chan handleCommand
	// latest are the newest-state watches, by stream name.
	latest map[string]*consistd.Latest
	// held is what each worker of a newest-state watch holds, by stream and worker.
	held map[workerKey]*consistd.Taken
}

// workerKey names a worker of a newest-state watch: the watch's stream and the worker's name.
type workerKey struct{ stream, worker string }

// handlerKey names a waiting reconcile pass: the reconcile's stream and the item's name.
type handlerKey struct{ stream, name string }

// handleCommand is what a handle tells a waiting pass: the status condition to set first (nil for none),
// the event to record next (nil for none), the merge patch to write last (nil for none), whether to end
// DONE (else RETRY), and where to answer with the writes' result.
type handleCommand struct {
	condition *consistd.Condition
	event     *consistd.EventRecord
	patch     json.RawMessage
	done      bool
	answer    chan<- handled
}

// handled is the result of a pass's write: the handle's answer or its error.
type handled struct {
	ok  any
	err error
}

// pausedWatch is a watch whose events are taken only when a take command asks: next is the app taking
// the next event (iter.Pull2), so the SDK applies the own-write rule at that moment.
type pausedWatch struct {
	// mu makes takes of one watch run one after another (next must not be called concurrently).
	mu   sync.Mutex
	next func() (consistd.Event, error, bool)
}

// failure is a command's or a stream's error as the protocol prints it.
type failure struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (f *failure) Error() string { return f.Code + ": " + f.Message }

// invalid is the failure of a command the agent cannot run: an unknown op, a missing field or one of
// the wrong type.
func invalid(format string, args ...any) *failure {
	return &failure{Code: "INVALID_ARGUMENT", Message: fmt.Sprintf(format, args...)}
}

// codeNames are the gRPC codes' canonical names (grpc-go's String gives "Unavailable", "Canceled", ...).
var codeNames = map[codes.Code]string{
	codes.OK:                 "OK",
	codes.Canceled:           "CANCELLED",
	codes.Unknown:            "UNKNOWN",
	codes.InvalidArgument:    "INVALID_ARGUMENT",
	codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
	codes.NotFound:           "NOT_FOUND",
	codes.AlreadyExists:      "ALREADY_EXISTS",
	codes.PermissionDenied:   "PERMISSION_DENIED",
	codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION",
	codes.Aborted:            "ABORTED",
	codes.OutOfRange:         "OUT_OF_RANGE",
	codes.Unimplemented:      "UNIMPLEMENTED",
	codes.Internal:           "INTERNAL",
	codes.Unavailable:        "UNAVAILABLE",
	codes.DataLoss:           "DATA_LOSS",
	codes.Unauthenticated:    "UNAUTHENTICATED",
}

// failureOf is the failure of an error the SDK returned: its gRPC status code and message. A context's
// error (what the SDK returns when the ctx the agent gave it ends) counts as that context's status:
// DEADLINE_EXCEEDED for a timeout, CANCELLED for a cancellation.
func failureOf(err error) *failure {
	var f *failure
	if errors.As(err, &f) {
		return f
	}
	s, ok := status.FromError(err)
	if !ok && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		s = status.FromContextError(err)
	}
	name, known := codeNames[s.Code()]
	if !known {
		name = fmt.Sprintf("CODE_%d", s.Code())
	}
	return &failure{Code: name, Message: s.Message()}
}

// serve reads commands from r until it ends, starting each on a goroutine of its own.
func (a *agent) serve(ctx context.Context, r io.Reader) error {
	lines := bufio.NewScanner(r)
	// A patch or a payload may be long: allow lines of up to 16 MiB.
	lines.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for lines.Scan() {
		line := lines.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var c command
		if err := json.Unmarshal(line, &c); err != nil {
			log.Printf("not a JSON command (%v): %s", err, line)
			continue
		}
		go a.run(ctx, c)
	}
	return lines.Err()
}

// command is one command line: its id, op and fields, each field still JSON.
type command map[string]json.RawMessage

// text is the string field name, which must be set.
func (c command) text(name string) (string, error) {
	var s string
	if err := c.decode(name, &s, true); err != nil {
		return "", invalid("%s: must be a string", name)
	}
	return s, nil
}

// number is the non-negative integer field name; 0 when absent, unless it is required.
func (c command) number(name string, required bool) (uint64, error) {
	var n uint64
	if err := c.decode(name, &n, required); err != nil {
		return 0, invalid("%s: must be a non-negative integer", name)
	}
	return n, nil
}

// flag is the boolean field name; false when absent.
func (c command) flag(name string) (bool, error) {
	var b bool
	if err := c.decode(name, &b, false); err != nil {
		return false, invalid("%s: must be a boolean", name)
	}
	return b, nil
}

// decode unmarshals field name into v; an absent field (or null) is an error only if required.
func (c command) decode(name string, v any, required bool) error {
	raw, ok := c[name]
	if !ok || string(raw) == "null" {
		if required {
			return errors.New("missing")
		}
		return nil
	}
	return json.Unmarshal(raw, v)
}

// guard is the guard field, {"election", "namespace", "term"}; nil when absent or null.
func (c command) guard() (*consistd.Guard, error) {
	var g *struct {
		Election  *string `json:"election"`
		Namespace *string `json:"namespace"`
		Term      *uint64 `json:"term"`
	}
	err := c.decode("guard", &g, false)
	if err != nil || g != nil && (g.Election == nil || g.Namespace == nil || g.Term == nil) {
		return nil, invalid(`guard: must be {"election", "namespace", "term"} (two strings and a non-negative integer) or null`)
	}
	if g == nil {
		return nil, nil
	}
	return &consistd.Guard{Election: *g.Election, Namespace: *g.Namespace, Term: *g.Term}, nil
}

// print writes one line (v as JSON) to standard output, whole, and flushes it.
func (a *agent) print(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		log.Printf("encoding %#v: %v", v, err)
		return
	}
	a.outMu.Lock()
	defer a.outMu.Unlock()
	a.out.Write(line)
	a.out.WriteByte('\n')
	if err := a.out.Flush(); err != nil {
		log.Printf("writing to standard output: %v", err)
	}
}

// answer is a command's answer line: ok or error.
type answer struct {
	ID    json.RawMessage `json:"id"`
	OK    any             `json:"ok,omitempty"`
	Error *failure        `json:"error,omitempty"`
}

// streamLine is a line a watch or a campaign prints: an item, or the error that ended it.
type streamLine struct {
	Stream string   `json:"stream"`
	Item   any      `json:"item,omitempty"`
	Error  *failure `json:"error,omitempty"`
}

// empty is the answer of ops that answer {}.
type empty struct{}

// run handles one command and prints its answer.
func (a *agent) run(ctx context.Context, c command) {
	id := c["id"]
	if id == nil {
		id = json.RawMessage("null")
	}
	var (
		ok  any
		err error
	)
	op, _ := c.text("op")
	switch op {
	case "get":
		ok, err = a.get(ctx, c)
	case "patch":
		ok, err = a.patch(ctx, c)
	case "watch":
		ok, err = a.watch(ctx, c)
	case "take":
		ok, err = a.take(c)
	case "send":
		ok, err = a.send(ctx, c)
	case "outcome":
		ok, err = a.outcome(ctx, c)
	case "campaign":
		ok, err = a.campaign(ctx, c)
	case "reconcile":
		ok, err = a.reconcile(ctx, c)
	case "handle":
		ok, err = a.handle(c)
	case "latest":
		ok, err = a.openLatest(ctx, c)
	case "next":
		ok, err = a.next(ctx, c)
	case "done":
		ok, err = a.done(c)
	default:
		err = invalid("op: unknown op %q", op)
	}
	if err != nil {
		a.print(answer{ID: id, Error: failureOf(err)})
		return
	}
	a.print(answer{ID: id, OK: ok})
}

// objectKey is the resource, namespace and name fields of get and patch.
func objectKey(c command) (resource, namespace, name string, err error) {
	if resource, err = c.text("resource"); err != nil {
		return
	}
	if namespace, err = c.text("namespace"); err != nil {
		return
	}
	name, err = c.text("name")
	return
}

// get reads the object.
func (a *agent) get(ctx context.Context, c command) (any, error) {
	resource, namespace, name, err := objectKey(c)
	if err != nil {
		return nil, err
	}
	obj, err := a.client.Get(ctx, resource, namespace, name)
	if err != nil {
		return nil, err
	}
	return struct {
		ResourceVersion string `json:"resourceVersion"`
	}{obj.ResourceVersion}, nil
}

// patch merge-patches the object through the SDK's objects client, which records what it returned for
// the own-write rule of the client's watches.
func (a *agent) patch(ctx context.Context, c command) (any, error) {
	resource, namespace, name, err := objectKey(c)
	if err != nil {
		return nil, err
	}
	patch, ok := c["patch"]
	if !ok {
		return nil, invalid("patch: must be set")
	}
	obj, err := a.client.Patch(ctx, resource, namespace, name, consistd.MergePatch, []byte(patch))
	if err != nil {
		return nil, err
	}
	return struct {
		ResourceVersion string `json:"resourceVersion"`
		UID             string `json:"uid"`
	}{obj.ResourceVersion, obj.UID}, nil
}

// eventItem is a watch event as the protocol prints it.
type eventItem struct {
	Type             string `json:"type"`
	Name             string `json:"name"`
	ResourceVersion  string `json:"resourceVersion"`
	PredatesOwnWrite bool   `json:"predatesOwnWrite"`
}

// eventLine is the line a watch prints for what the SDK gave the app: an event, or the error that ended
// the watch.
func eventLine(stream string, ev consistd.Event, err error) streamLine {
	if err != nil {
		return streamLine{Stream: stream, Error: failureOf(err)}
	}
	item := eventItem{Type: ev.Type.String(), PredatesOwnWrite: ev.PredatesOwnWrite}
	if ev.Object != nil {
		item.Name, item.ResourceVersion = ev.Object.Name, ev.Object.ResourceVersion
	}
	return streamLine{Stream: stream, Item: item}
}

// watch subscribes. With take true it takes every event as it comes and prints it; with take false it
// keeps the watch for take commands, taking nothing until then.
func (a *agent) watch(ctx context.Context, c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	var req consistd.WatchRequest
	if req.Resource, err = c.text("resource"); err != nil {
		return nil, err
	}
	if req.Namespace, err = c.text("namespace"); err != nil {
		return nil, err
	}
	mode, err := c.text("mode")
	if err != nil {
		return nil, err
	}
	switch mode {
	case "RAW":
		req.Mode = consistd.RawMode
	case "CONSISTENT":
		req.Mode = consistd.ConsistentMode
	default:
		return nil, invalid("mode: %q is neither RAW nor CONSISTENT", mode)
	}
	take, err := c.flag("take")
	if err != nil {
		return nil, err
	}
	events := a.client.Watch(ctx, req)
	if take {
		go func() {
			for ev, err := range events {
				a.print(eventLine(stream, ev, err))
			}
		}()
		return empty{}, nil
	}
	// The watch lives as long as the agent: its stop function is never needed.
	next, _ := iter.Pull2(events)
	a.mu.Lock()
	a.paused[stream] = &pausedWatch{next: next}
	a.mu.Unlock()
	return empty{}, nil
}

// take takes the next count events of a watch started with take false, printing each.
func (a *agent) take(c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	count, err := c.number("count", true)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	w := a.paused[stream]
	a.mu.Unlock()
	if w == nil {
		return nil, invalid("stream: no watch %q started with take false", stream)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for range count {
		ev, err, ok := w.next()
		if !ok {
			// The watch ended (its error, if any, was printed when it was taken).
			break
		}
		a.print(eventLine(stream, ev, err))
	}
	return empty{}, nil
}

// send sends the message, under the guard when one is given (SendRequest.Guard), and keeps what Send
// returned under its message id.
func (a *agent) send(ctx context.Context, c command) (any, error) {
	peer, err := c.text("peer")
	if err != nil {
		return nil, err
	}
	req := consistd.SendRequest{To: consistd.ToPeer(peer)}
	if req.ResourceID, err = c.text("resourceId"); err != nil {
		return nil, err
	}
	if req.EventID, err = c.text("eventId"); err != nil {
		return nil, err
	}
	payload, err := c.text("payload")
	if err != nil {
		return nil, err
	}
	req.Payload = []byte(payload)
	if req.Guard, err = c.guard(); err != nil {
		return nil, err
	}
	sent, err := a.client.Send(ctx, req)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.sent[sent.MessageID] = sent
	a.mu.Unlock()
	return struct {
		MessageID string `json:"messageId"`
	}{sent.MessageID}, nil
}

// outcome awaits the outcome of a send (Sent.Wait), bounded by a ctx deadline when timeoutMs is set.
func (a *agent) outcome(ctx context.Context, c command) (any, error) {
	id, err := c.text("messageId")
	if err != nil {
		return nil, err
	}
	timeout, err := c.number("timeoutMs", false)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	sent := a.sent[id]
	a.mu.Unlock()
	if sent == nil {
		return nil, invalid("messageId: this agent sent no message %q", id)
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(timeout)*time.Millisecond)
		defer cancel()
	}
	o, err := sent.Wait(ctx)
	if err != nil {
		return nil, err
	}
	return struct {
		Outcome string `json:"outcome"`
		Peer    string `json:"peer"`
		Reason  string `json:"reason"`
	}{o.Kind.String(), o.Peer, o.Reason}, nil
}

// stateItem is a leadership state as the protocol prints it.
type stateItem struct {
	State  string `json:"state"`
	Holder string `json:"holder"`
	Term   uint64 `json:"term"`
}

// campaign campaigns and prints every state the SDK's channel sends; the last one, if the daemon
// refused the campaign, as the stream's error.
func (a *agent) campaign(ctx context.Context, c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	election, err := c.text("election")
	if err != nil {
		return nil, err
	}
	namespace, err := c.text("namespace")
	if err != nil {
		return nil, err
	}
	states := a.client.Campaign(ctx, election, consistd.InNamespace(namespace))
	go func() {
		for l := range states {
			if l.Err != nil {
				a.print(streamLine{Stream: stream, Error: failureOf(l.Err)})
				continue
			}
			a.print(streamLine{Stream: stream, Item: stateItem{State: l.State.String(), Holder: l.Holder, Term: l.Term}})
		}
	}()
	return empty{}, nil
}

// workItem is a work item as the protocol prints it.
type workItem struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	Term       uint64 `json:"term"`
	Attempt    uint32 `json:"attempt"`
	LeaseID    string `json:"leaseId"`
	Finalizing bool   `json:"finalizing"`
}

// workItemOf is the item as the protocol prints it.
func workItemOf(item consistd.Item) workItem {
	return workItem{
		Namespace: item.Namespace, Name: item.Name, Term: item.Term, Attempt: item.Attempt, LeaseID: item.LeaseID,
		Finalizing: item.Finalizing,
	}
}

// reconcile runs the SDK's reconciler on the queue, its handler printing each item and then waiting for
// the item's handle. The reconciler runs as long as the agent; should it end (the daemon refused the
// spec), its error is the stream's last line.
func (a *agent) reconcile(ctx context.Context, c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	spec, err := c.reconcileSpec()
	if err != nil {
		return nil, err
	}
	handler := consistd.ReconcilerFunc(func(ctx context.Context, item consistd.Item) (consistd.Result, error) {
		return a.handler(ctx, stream, item)
	})
	go func() {
		err := a.client.Reconcile(ctx, spec, handler)
		log.Printf("the reconciler of stream %q ended: %v", stream, err)
		a.print(streamLine{Stream: stream, Error: failureOf(err)})
	}()
	return empty{}, nil
}

// reconcileSpec is the queue a reconcile command names: queue, resource and namespace; election and
// electionNamespace unless election is absent, null or empty (no election); changes, whose parts set to
// true go into the spec's Changes (absent or null: none, every change); and finalizer, the spec's
// Finalizer (absent, null or empty: none).
func (c command) reconcileSpec() (consistd.ReconcileSpec, error) {
	var spec consistd.ReconcileSpec
	var err error
	for _, f := range []struct {
		name string
		into *string
	}{
		{"queue", &spec.Name},
		{"resource", &spec.Resource},
		{"namespace", &spec.Namespace},
	} {
		if *f.into, err = c.text(f.name); err != nil {
			return spec, err
		}
	}
	if err := c.decode("election", &spec.Election, false); err != nil {
		return spec, invalid("election: must be a string, or absent or null")
	}
	if spec.Election != "" {
		if spec.ElectionNamespace, err = c.text("electionNamespace"); err != nil {
			return spec, err
		}
	}
	var changes struct {
		Generation  bool `json:"generation"`
		Labels      bool `json:"labels"`
		Annotations bool `json:"annotations"`
	}
	if err := c.decode("changes", &changes, false); err != nil {
		return spec, invalid(`changes: must be {"generation", "labels", "annotations"} (booleans, each may be absent) or null`)
	}
	spec.Changes = consistd.Changes{Generation: changes.Generation, Labels: changes.Labels, Annotations: changes.Annotations}
	if err := c.decode("finalizer", &spec.Finalizer, false); err != nil {
		return spec, invalid("finalizer: must be a string, or absent or null")
	}
	return spec, nil
}

// handler is the Reconciler's pass: it waits as (stream, item name) before printing the item, takes the
// item's handle, sets the condition it gives (if any) through the item (Item.SetCondition), records the
// event it gives (if any) through the item (Item.RecordEvent), writes the patch it gives (if any) to the
// item's primary through the objects client with ForItem (as an app would, with whatever guard the SDK
// adds), answers with the writes' result and ends as told: DONE returns success, RETRY an error, which the
// SDK retries. A condition that could not be set, or an event that could not be recorded, is the answer,
// and the pass ends with an error (a retry).
func (a *agent) handler(ctx context.Context, stream string, item consistd.Item) (consistd.Result, error) {
	key := handlerKey{stream, item.Name}
	told := make(chan handleCommand, 1)
	a.mu.Lock()
	a.handlers[key] = told
	a.mu.Unlock()
	a.print(streamLine{Stream: stream, Item: workItemOf(item)})
	var h handleCommand
	select {
	case h = <-told:
	case <-ctx.Done():
		// The lease is gone (timed out, or the stream was lost). Unless a handle already took this
		// pass (it sends while holding mu), no handle will find it now.
		a.mu.Lock()
		mine := a.handlers[key] == told
		if mine {
			delete(a.handlers, key)
		}
		a.mu.Unlock()
		if mine {
			return consistd.Result{}, ctx.Err()
		}
		h = <-told
	}
	answer := map[string]any{}
	if h.condition != nil {
		set, err := item.SetCondition(ctx, *h.condition)
		if err != nil {
			h.answer <- handled{err: err}
			return consistd.Result{}, fmt.Errorf("the condition was not set: %w", err)
		}
		answer["condition"] = conditionSet{Changed: set.Changed, LastTransitionTime: transitionTime(set.LastTransitionTime)}
	}
	if h.event != nil {
		recorded, err := item.RecordEvent(ctx, *h.event)
		if err != nil {
			h.answer <- handled{err: err}
			return consistd.Result{}, fmt.Errorf("the event was not recorded: %w", err)
		}
		answer["event"] = eventRecorded{Recorded: recorded}
	}
	result := handled{ok: answer}
	if h.patch != nil {
		rv, err := a.writeForItem(ctx, item, h.patch)
		if err != nil {
			result = handled{err: err}
		} else {
			answer["resourceVersion"] = rv
		}
	}
	h.answer <- result
	if !h.done {
		return consistd.Result{}, errors.New("the suite asked for a retry")
	}
	return consistd.Result{}, nil
}

// conditionSet is a handle's answer about the condition it set: whether it was written, and its
// lastTransitionTime.
type conditionSet struct {
	Changed            bool   `json:"changed"`
	LastTransitionTime string `json:"lastTransitionTime"`
}

// eventRecorded is a handle's answer about the event it recorded: false when the rate limit dropped it.
type eventRecorded struct {
	Recorded bool `json:"recorded"`
}

// transitionTime is a lastTransitionTime as RFC 3339 ("" for the zero time).
func transitionTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format(time.RFC3339Nano)
}

// writeForItem merge-patches the item's primary, a ConfigMap, for the item, and answers with the written
// resourceVersion.
func (a *agent) writeForItem(ctx context.Context, item consistd.Item, patch json.RawMessage) (string, error) {
	obj, err := a.client.Patch(ctx, "configmaps", item.Namespace, item.Name, consistd.MergePatch, []byte(patch),
		consistd.ForItem(item))
	if err != nil {
		return "", err
	}
	return obj.ResourceVersion, nil
}

// condition is the handle's condition field, {"type", "status", "reason", "message"} with a status of
// "True", "False" or "Unknown", as the SDK's Condition; nil when absent or null.
func (c command) condition() (*consistd.Condition, error) {
	var set *struct {
		Type    *string `json:"type"`
		Status  *string `json:"status"`
		Reason  *string `json:"reason"`
		Message *string `json:"message"`
	}
	err := c.decode("condition", &set, false)
	if err != nil || set != nil && (set.Type == nil || set.Status == nil || set.Reason == nil || set.Message == nil) {
		return nil, invalid(`condition: must be {"type", "status", "reason", "message"} (four strings) or null`)
	}
	if set == nil {
		return nil, nil
	}
	value := consistd.ConditionStatus(*set.Status)
	switch value {
	case consistd.ConditionTrue, consistd.ConditionFalse, consistd.ConditionUnknown:
	default:
		return nil, invalid("condition.status: %q is not True, False or Unknown", *set.Status)
	}
	return &consistd.Condition{Type: *set.Type, Status: value, Reason: *set.Reason, Message: *set.Message}, nil
}

// event is the handle's event field, {"severity", "reason", "action", "note"} with a severity of "Normal"
// or "Warning", as the SDK's EventRecord; nil when absent or null.
func (c command) event() (*consistd.EventRecord, error) {
	var e *struct {
		Severity *string `json:"severity"`
		Reason   *string `json:"reason"`
		Action   *string `json:"action"`
		Note     *string `json:"note"`
	}
	err := c.decode("event", &e, false)
	if err != nil || e != nil && (e.Severity == nil || e.Reason == nil || e.Action == nil || e.Note == nil) {
		return nil, invalid(`event: must be {"severity", "reason", "action", "note"} (four strings) or null`)
	}
	if e == nil {
		return nil, nil
	}
	severity := consistd.EventSeverity(*e.Severity)
	switch severity {
	case consistd.EventNormal, consistd.EventWarning:
	default:
		return nil, invalid("event.severity: %q is not Normal or Warning", *e.Severity)
	}
	return &consistd.EventRecord{Severity: severity, Reason: *e.Reason, Action: *e.Action, Note: *e.Note}, nil
}

// handle hands the pass waiting with item name its condition, event, patch and outcome, and answers with
// its writes' result.
func (a *agent) handle(c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	name, err := c.text("name")
	if err != nil {
		return nil, err
	}
	outcome, err := c.text("outcome")
	if err != nil {
		return nil, err
	}
	var done bool
	switch outcome {
	case "DONE":
		done = true
	case "RETRY":
	default:
		return nil, invalid("outcome: %q is neither DONE nor RETRY", outcome)
	}
	var patch json.RawMessage
	if raw, ok := c["patch"]; ok && string(raw) != "null" {
		patch = raw
	}
	condition, err := c.condition()
	if err != nil {
		return nil, err
	}
	event, err := c.event()
	if err != nil {
		return nil, err
	}
	answer := make(chan handled, 1)
	a.mu.Lock()
	told, waiting := a.handlers[handlerKey{stream, name}]
	if waiting {
		delete(a.handlers, handlerKey{stream, name})
		// told has room for this one command, the only one it is sent.
		told <- handleCommand{condition: condition, event: event, patch: patch, done: done, answer: answer}
	}
	a.mu.Unlock()
	if !waiting {
		return nil, invalid("name: no handler of stream %q waits with item %q", stream, name)
	}
	r := <-answer
	return r.ok, r.err
}

// openLatest opens the SDK's newest-state consumer of a ConsistentMode watch.
func (a *agent) openLatest(ctx context.Context, c command) (any, error) {
	stream, err := c.text("stream")
	if err != nil {
		return nil, err
	}
	var req consistd.WatchRequest
	if req.Resource, err = c.text("resource"); err != nil {
		return nil, err
	}
	if req.Namespace, err = c.text("namespace"); err != nil {
		return nil, err
	}
	// It lives as long as the agent.
	latest := a.client.WatchLatest(ctx, req)
	a.mu.Lock()
	a.latest[stream] = latest
	a.mu.Unlock()
	return empty{}, nil
}

// worker is the stream and worker fields of next and done.
func worker(c command) (workerKey, error) {
	stream, err := c.text("stream")
	if err != nil {
		return workerKey{}, err
	}
	name, err := c.text("worker")
	return workerKey{stream, name}, err
}

// next has a worker ask for the next object's newest state, and hold it until its done.
func (a *agent) next(ctx context.Context, c command) (any, error) {
	key, err := worker(c)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	latest := a.latest[key.stream]
	_, holding := a.held[key]
	a.mu.Unlock()
	if latest == nil {
		return nil, invalid("stream: no newest-state watch %q", key.stream)
	}
	if holding {
		return nil, invalid("worker: %q holds an object already", key.worker)
	}
	taken, err := latest.Next(ctx)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	a.held[key] = taken
	a.mu.Unlock()
	return eventLine("", taken.Event, nil).Item, nil
}

// done tells the SDK the worker is done with the object it holds.
func (a *agent) done(c command) (any, error) {
	key, err := worker(c)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	taken := a.held[key]
	delete(a.held, key)
	a.mu.Unlock()
	if taken == nil {
		return nil, invalid("worker: %q holds nothing", key.worker)
	}
	taken.Done()
	return empty{}, nil
}
