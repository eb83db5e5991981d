package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// The code is the canonical name of the status the SDK returned; a context's own error counts as its
// status (what Sent.Wait returns when the agent's timeout ends a wait).
func TestFailureOfNamesTheCanonicalCode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unavailable, "gone"), "UNAVAILABLE"},
		{status.Error(codes.NotFound, "forgotten"), "NOT_FOUND"},
		{status.Error(codes.Canceled, "closed"), "CANCELLED"},
		{status.Error(codes.DeadlineExceeded, "late"), "DEADLINE_EXCEEDED"},
		{context.DeadlineExceeded, "DEADLINE_EXCEEDED"},
		{fmt.Errorf("waiting: %w", context.DeadlineExceeded), "DEADLINE_EXCEEDED"},
		{ctx.Err(), "CANCELLED"},
		{fmt.Errorf("not a status"), "UNKNOWN"},
		{invalid("x: must be a string"), "INVALID_ARGUMENT"},
	} {
		if got := failureOf(tc.err).Code; got != tc.want {
			t.Errorf("failureOf(%v).Code = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// Commands the agent cannot run are answered INVALID_ARGUMENT under their id, one JSON line each.
func TestCommandsItCannotRunAreInvalidArgument(t *testing.T) {
	for _, line := range []string{
		`{"id": 1, "op": "nope"}`,
		`{"id": 2}`,
		`{"id": 3, "op": "get", "resource": "configmaps", "namespace": 7, "name": "x"}`,
		`{"id": 4, "op": "watch", "stream": "w", "resource": "configmaps", "namespace": "n", "mode": "FAST", "take": true}`,
		`{"id": 5, "op": "watch", "stream": "w", "resource": "configmaps", "namespace": "n", "mode": "RAW", "take": "yes"}`,
		`{"id": 6, "op": "take", "stream": "w"}`,
		`{"id": 7, "op": "take", "stream": "w", "count": -1}`,
		`{"id": 8, "op": "take", "stream": "unknown", "count": 1}`,
		`{"id": 9, "op": "outcome", "messageId": "m", "timeoutMs": "soon"}`,
		`{"id": 10, "op": "outcome", "messageId": "never-sent"}`,
		`{"id": 11, "op": "patch", "resource": "configmaps", "namespace": "n", "name": "x"}`,
		`{"id": 12, "op": "send", "peer": "b:1", "resourceId": "r", "eventId": "1", "payload": "x", "guard": "lead"}`,
		`{"id": 13, "op": "send", "peer": "b:1", "resourceId": "r", "eventId": "1", "payload": "x", "guard": {"election": "lead", "namespace": "n"}}`,
		`{"id": 14, "op": "send", "peer": "b:1", "resourceId": "r", "eventId": "1", "payload": "x", "guard": {"election": "lead", "namespace": "n", "term": "3"}}`,
		`{"id": 15, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "changes": {"labels": "yes"}}`,
		`{"id": 16, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "changes": ["labels"]}`,
		`{"id": 17, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "election": 7}`,
		`{"id": 18, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "election": "lead"}`,
		`{"id": 19, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "finalizer": 7}`,
		`{"id": 20, "op": "reconcile", "stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n", "finalizer": ["example.com/cleanup"]}`,
	} {
		var out bytes.Buffer
		a := &agent{out: bufio.NewWriter(&out), sent: map[string]*consistd.Sent{}, paused: map[string]*pausedWatch{}}
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		a.run(context.Background(), c)
		var got struct {
			ID    json.Number `json:"id"`
			OK    any         `json:"ok"`
			Error *failure    `json:"error"`
		}
		if !strings.HasSuffix(out.String(), "\n") || strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("%s: answered %q, want one line", line, out.String())
		}
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("%s: answered %q: %v", line, out.String(), err)
		}
		if got.ID.String() != string(c["id"]) || got.OK != nil || got.Error == nil || got.Error.Code != "INVALID_ARGUMENT" {
			t.Errorf("%s: answered %s, want INVALID_ARGUMENT under its id", line, out.String())
		}
	}
}

// The guard of a send is the SDK's Guard, with every field as given; absent or null, there is none.
func TestTheGuardFieldIsAGuardOrNone(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *consistd.Guard
	}{
		{`{"guard": {"election": "lead", "namespace": "n", "term": 3}}`, &consistd.Guard{Election: "lead", Namespace: "n", Term: 3}},
		{`{"guard": {"election": "lead", "namespace": "", "term": 0}}`, &consistd.Guard{Election: "lead"}},
		{`{"guard": null}`, nil},
		{`{}`, nil},
	} {
		var c command
		if err := json.Unmarshal([]byte(tc.line), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.guard()
		if err != nil || (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("%s: guard %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

// A reconcile's queue goes into the SDK's ReconcileSpec: election only when it is set and not empty, and
// the parts changes sets to true into Changes (absent or null: the zero Changes, every change), and
// finalizer into Finalizer (absent, null or empty: none).
func TestTheReconcileCommandIsTheSDKsSpec(t *testing.T) {
	base := consistd.ReconcileSpec{Name: "q", Resource: "configmaps", Namespace: "n"}
	for _, tc := range []struct {
		fields string
		want   func(*consistd.ReconcileSpec)
	}{
		{``, func(*consistd.ReconcileSpec) {}},
		{`, "election": "", "electionNamespace": "n"`, func(*consistd.ReconcileSpec) {}},
		{`, "election": null, "changes": null`, func(*consistd.ReconcileSpec) {}},
		{`, "election": "lead", "electionNamespace": "leases"`, func(s *consistd.ReconcileSpec) {
			s.Election, s.ElectionNamespace = "lead", "leases"
		}},
		{`, "changes": {}`, func(*consistd.ReconcileSpec) {}},
		{`, "changes": {"labels": true}`, func(s *consistd.ReconcileSpec) { s.Changes.Labels = true }},
		{`, "changes": {"generation": true, "labels": false, "annotations": true}`, func(s *consistd.ReconcileSpec) {
			s.Changes = consistd.Changes{Generation: true, Annotations: true}
		}},
		{`, "finalizer": null`, func(*consistd.ReconcileSpec) {}},
		{`, "finalizer": ""`, func(*consistd.ReconcileSpec) {}},
		{`, "finalizer": "conformance.consistd.io/cleanup"`, func(s *consistd.ReconcileSpec) {
			s.Finalizer = "conformance.consistd.io/cleanup"
		}},
	} {
		line := `{"stream": "s", "queue": "q", "resource": "configmaps", "namespace": "n"` + tc.fields + `}`
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		want := base
		tc.want(&want)
		got, err := c.reconcileSpec()
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: spec %+v, %v; want %+v", line, got, err, want)
		}
	}
}

// A work item prints the SDK item's key, term, attempt, lease and finalizing under the protocol's names.
func TestAWorkItemPrintsItsFinalizing(t *testing.T) {
	for _, finalizing := range []bool{false, true} {
		item := consistd.Item{Namespace: "n", Name: "held", Term: 3, Attempt: 2, LeaseID: "q.1.2", Finalizing: finalizing}
		line, err := json.Marshal(workItemOf(item))
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`{"namespace":"n","name":"held","term":3,"attempt":2,"leaseId":"q.1.2","finalizing":%t}`, finalizing)
		if string(line) != want {
			t.Errorf("printed %s, want %s", line, want)
		}
	}
}

// A handle's condition is the SDK's Condition, its status one of the SDK's three; absent or null, there is
// none, and anything else is INVALID_ARGUMENT naming the field.
func TestTheHandlesConditionIsTheSDKsCondition(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *consistd.Condition
	}{
		{`{"condition": {"type": "Ready", "status": "True", "reason": "Available", "message": "3 of 3"}}`,
			&consistd.Condition{Type: "Ready", Status: consistd.ConditionTrue, Reason: "Available", Message: "3 of 3"}},
		{`{"condition": {"type": "Ready", "status": "False", "reason": "Creating", "message": ""}}`,
			&consistd.Condition{Type: "Ready", Status: consistd.ConditionFalse, Reason: "Creating"}},
		{`{"condition": {"type": "Synced", "status": "Unknown", "reason": "Pending", "message": "m"}}`,
			&consistd.Condition{Type: "Synced", Status: consistd.ConditionUnknown, Reason: "Pending", Message: "m"}},
		{`{"condition": null}`, nil},
		{`{}`, nil},
	} {
		var c command
		if err := json.Unmarshal([]byte(tc.line), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.condition()
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: condition %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	for _, line := range []string{
		`{"condition": {"type": "Ready", "status": "true", "reason": "R", "message": ""}}`,
		`{"condition": {"type": "Ready", "status": "Yes", "reason": "R", "message": ""}}`,
		`{"condition": {"type": "Ready", "status": "True", "reason": "R"}}`,
		`{"condition": {"type": "Ready", "status": true, "reason": "R", "message": ""}}`,
		`{"condition": "Ready"}`,
	} {
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.condition()
		if f := failureOf(err); err == nil || f.Code != "INVALID_ARGUMENT" || !strings.HasPrefix(f.Message, "condition") {
			t.Errorf("%s: condition %+v, %v; want INVALID_ARGUMENT naming condition", line, got, err)
		}
	}
}

// The condition's answer is {"changed", "lastTransitionTime"}, the time as RFC 3339 (empty when zero).
func TestAConditionSetIsAnsweredWithChangedAndItsTransitionTime(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		set  conditionSet
		want string
	}{
		{conditionSet{Changed: true, LastTransitionTime: transitionTime(at)}, `{"changed":true,"lastTransitionTime":"2026-01-02T03:04:05Z"}`},
		{conditionSet{LastTransitionTime: transitionTime(time.Time{})}, `{"changed":false,"lastTransitionTime":""}`},
	} {
		line, err := json.Marshal(tc.set)
		if err != nil || string(line) != tc.want {
			t.Errorf("printed %s, %v; want %s", line, err, tc.want)
		}
	}
}

// A handle's event is the SDK's EventRecord, its severity one of the SDK's two; absent or null, there is
// none, and anything else is INVALID_ARGUMENT naming the field.
func TestTheHandlesEventIsTheSDKsEventRecord(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *consistd.EventRecord
	}{
		{`{"event": {"severity": "Warning", "reason": "Drifted", "action": "Reconcile", "note": "data moved"}}`,
			&consistd.EventRecord{Severity: consistd.EventWarning, Reason: "Drifted", Action: "Reconcile", Note: "data moved"}},
		{`{"event": {"severity": "Normal", "reason": "Synced", "action": "Sync", "note": ""}}`,
			&consistd.EventRecord{Severity: consistd.EventNormal, Reason: "Synced", Action: "Sync"}},
		{`{"event": null}`, nil},
		{`{}`, nil},
	} {
		var c command
		if err := json.Unmarshal([]byte(tc.line), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.event()
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: event %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	for _, line := range []string{
		`{"event": {"severity": "normal", "reason": "R", "action": "A", "note": ""}}`,
		`{"event": {"severity": "Error", "reason": "R", "action": "A", "note": ""}}`,
		`{"event": {"severity": "Normal", "reason": "R", "action": "A"}}`,
		`{"event": {"severity": 1, "reason": "R", "action": "A", "note": ""}}`,
		`{"event": "Drifted"}`,
	} {
		var c command
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatal(err)
		}
		got, err := c.event()
		if f := failureOf(err); err == nil || f.Code != "INVALID_ARGUMENT" || !strings.HasPrefix(f.Message, "event") {
			t.Errorf("%s: event %+v, %v; want INVALID_ARGUMENT naming event", line, got, err)
		}
	}
}

// The event's answer is {"recorded"}.
func TestAnEventIsAnsweredWithWhetherItWasRecorded(t *testing.T) {
	for recorded, want := range map[bool]string{true: `{"recorded":true}`, false: `{"recorded":false}`} {
		line, err := json.Marshal(eventRecorded{Recorded: recorded})
		if err != nil || string(line) != want {
			t.Errorf("printed %s, %v; want %s", line, err, want)
		}
	}
}
