// Tests of the own-write rule against the daemons: a third party's change reaches the app's side while
// the app is busy, the app then writes the object itself, and only then takes the next event.

package consistd_test

import (
	"context"
	"iter"
	"testing"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// arrived is how long the test leaves a third party's change to reach the app's side of the watch.
const arrived = time.Second

func TestAConsistentWatchNeverHandsTheAppAStateOlderThanItsOwnWrite(t *testing.T) {
	app := ready(t, "")
	ns := freshNamespace(t, app)
	// The third party writes through daemon b: its writes are not the app's own, for daemon a or the SDK.
	other := ready(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	rv1 := mustCreate(t, other, ns, "shared").ResourceVersion

	w := pull(t, app, consistd.WatchRequest{Resource: "configmaps", Namespace: ns, LabelSelector: testLabel})
	w.expect(consistd.Added, rv1)
	w.expect(consistd.Synced, "")

	rv2, rv3 := changedBehindTheAppsBack(t, app, other, ns)
	ev := w.take()
	if ev.Type == consistd.Modified && ev.Object.ResourceVersion == rv2 {
		t.Fatalf("the app took %s, the third party's state, after its own write returned %s", rv2, rv3)
	}
	if ev.Type != consistd.Modified || ev.Object.ResourceVersion != rv3 || ev.Consistency != consistd.OwnWrite || ev.PredatesOwnWrite {
		t.Fatalf("took %s %s %s (predates %v), want MODIFIED shared@%s OWN_WRITE", ev.Type, describe(ev), ev.Consistency, ev.PredatesOwnWrite, rv3)
	}
}

func TestARawWatchMarksTheStateOlderThanTheAppsOwnWrite(t *testing.T) {
	app := ready(t, "")
	ns := freshNamespace(t, app)
	other := ready(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	rv1 := mustCreate(t, other, ns, "shared").ResourceVersion

	w := pull(t, app, consistd.WatchRequest{Resource: "configmaps", Namespace: ns, LabelSelector: testLabel, Mode: consistd.RawMode})
	w.expect(consistd.Added, rv1)
	w.expect(consistd.Synced, "")

	rv2, rv3 := changedBehindTheAppsBack(t, app, other, ns)
	if ev := w.expect(consistd.Modified, rv2); !ev.PredatesOwnWrite {
		t.Fatalf("the third party's state %s, taken after the app's write returned %s, is not marked as older", rv2, rv3)
	}
	if ev := w.expect(consistd.Modified, rv3); ev.PredatesOwnWrite {
		t.Fatalf("the app's own state %s is marked as older than its write", rv3)
	}
}

// changedBehindTheAppsBack has the third party change the object (rv2), leaves that change time to reach
// the app's side of the watch, then has the app patch the object itself (rv3). The app takes nothing
// meanwhile, as if it were busy.
func changedBehindTheAppsBack(t *testing.T, app, other *consistd.Client, ns string) (rv2, rv3 string) {
	t.Helper()
	theirs, err := other.Patch(testContext(t), "configmaps", ns, "shared", consistd.MergePatch, []byte(`{"data":{"k":"third party"}}`))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(arrived)
	mine, err := app.Patch(testContext(t), "configmaps", ns, "shared", consistd.MergePatch, []byte(`{"data":{"k":"app"}}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the third party wrote %s, then the app wrote %s", theirs.ResourceVersion, mine.ResourceVersion)
	return theirs.ResourceVersion, mine.ResourceVersion
}

// pulled is a watch whose events the test takes itself, one at a time (iter.Pull2). Unlike watching,
// nothing reads ahead of the test, so each take is the app taking the event.
type pulled struct {
	t    *testing.T
	next func() (consistd.Event, error, bool)
}

// pull starts c.Watch(req); it ends when the test ends, or after 2*waitFor (a take then fails).
func pull(t *testing.T, c *consistd.Client, req consistd.WatchRequest) *pulled {
	ctx, cancel := context.WithTimeout(testContext(t), 2*waitFor)
	next, stop := iter.Pull2(c.Watch(ctx, req))
	t.Cleanup(func() {
		cancel()
		stop()
	})
	return &pulled{t: t, next: next}
}

// take is the watch's next event; the test fails on an error or the end of the watch.
func (p *pulled) take() consistd.Event {
	p.t.Helper()
	ev, err, ok := p.next()
	if !ok {
		p.t.Fatalf("the watch ended (no event within %s?)", 2*waitFor)
	}
	if err != nil {
		p.t.Fatalf("the watch failed: %v", err)
	}
	return ev
}

// expect takes the next event and fails unless it has this type and resourceVersion ("" for markers).
func (p *pulled) expect(kind consistd.EventType, rv string) consistd.Event {
	p.t.Helper()
	ev := p.take()
	got := ""
	if ev.Object != nil {
		got = ev.Object.ResourceVersion
	}
	if ev.Type != kind || got != rv {
		p.t.Fatalf("took %s %s (predates %v), want %s @%s", ev.Type, describe(ev), ev.PredatesOwnWrite, kind, rv)
	}
	return ev
}
