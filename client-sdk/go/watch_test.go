// Tests of watches: the snapshot, own writes, resuming after a lost connection, a daemon restart.

package consistd_test

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func TestWatchConsistentSeesTheSnapshotThenItsOwnWrite(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	mustCreate(t, c, ns, "settings")

	w := watch(t, c, consistd.WatchRequest{Resource: "configmaps", Namespace: ns, LabelSelector: testLabel})
	added := w.next()
	if added.Type != consistd.Added || added.Object.Name != "settings" || added.Object.Namespace != ns {
		t.Fatalf("first event %s %s, want ADDED settings", added.Type, describe(added))
	}
	// The ADDED has a cursor only when the watch was new (a snapshot's objects have none): SYNCED always.
	if synced := w.next(); synced.Type != consistd.Synced || synced.Object != nil || synced.Cursor == "" {
		t.Fatalf("second event %s %s cursor %q, want SYNCED without an object, with a cursor", synced.Type, describe(synced), synced.Cursor)
	}

	patched, err := c.Patch(testContext(t), "configmaps", ns, "settings", consistd.MergePatch, map[string]any{"data": map[string]string{"k": "changed"}})
	if err != nil {
		t.Fatal(err)
	}
	ev := w.next()
	if ev.Type != consistd.Modified || ev.Object.ResourceVersion != patched.ResourceVersion || ev.Consistency != consistd.OwnWrite || ev.Cursor == "" {
		t.Fatalf("after the patch: %s %s %s cursor %q, want MODIFIED settings@%s OWN_WRITE with a cursor", ev.Type, describe(ev), ev.Consistency, ev.Cursor, patched.ResourceVersion)
	}
	var cm struct{ Data map[string]string }
	if err := ev.Object.Decode(&cm); err != nil || cm.Data["k"] != "changed" {
		t.Fatalf("object JSON %s (error %v), want data.k=changed", ev.Object.JSON, err)
	}
}

func TestWatchResumesAfterALostConnectionWithEveryEventOnceAndNoResync(t *testing.T) {
	a := ready(t, "")
	ns := freshNamespace(t, a)
	mustCreate(t, a, ns, "one")
	mustCreate(t, a, ns, "two")
	p := startProxy(t, env(t, "CONSISTD_SOCKET"))
	c := ready(t, p.Socket)

	w := watch(t, c, consistd.WatchRequest{Resource: "configmaps", Namespace: ns, LabelSelector: testLabel, Mode: consistd.RawMode})
	if names := w.initialState(); !maps.Equal(names, map[string]bool{"one": true, "two": true}) {
		t.Fatalf("initial state %v, want one and two", slices.Sorted(maps.Keys(names)))
	}
	mustCreate(t, a, ns, "three")
	expect(t, w, "ADDED three")

	// Changes made while the SDK cannot reach the daemon arrive after it resumes from its cursor.
	p.down()
	ctx := testContext(t)
	if _, err := a.Patch(ctx, "configmaps", ns, "one", consistd.MergePatch, []byte(`{"data":{"k":"changed"}}`)); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, a, ns, "four")
	if _, err := a.Delete(ctx, "configmaps", ns, "two"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	p.up()
	expect(t, w, "MODIFIED one", "ADDED four", "DELETED two")

	mustCreate(t, a, ns, "five")
	expect(t, w, "ADDED five")
	w.quiet(500 * time.Millisecond)
	if n := p.connections(); n < 2 {
		t.Fatalf("the SDK connected %d times through the proxy, want a reconnect", n)
	}
}

func TestWatchAfterADaemonRestartYieldsResyncThenAFreshSnapshot(t *testing.T) {
	a := ready(t, "")
	ns := freshNamespace(t, a)
	mustCreate(t, a, ns, "before")
	d := startDaemon(t, "sdk-go-restart")
	c := ready(t, d.Socket)

	w := watch(t, c, consistd.WatchRequest{Resource: "configmaps", Namespace: ns, LabelSelector: testLabel})
	if names := w.initialState(); !maps.Equal(names, map[string]bool{"before": true}) {
		t.Fatalf("initial state %v, want before", slices.Sorted(maps.Keys(names)))
	}

	d.stop()
	mustCreate(t, a, ns, "during")
	d.start()
	if ev := w.next(); ev.Type != consistd.ResyncRequired || ev.Object != nil {
		t.Fatalf("after the restart: %s %s, want RESYNC_REQUIRED", ev.Type, describe(ev))
	}
	if names := w.initialState(); !maps.Equal(names, map[string]bool{"before": true, "during": true}) {
		t.Fatalf("fresh snapshot %v, want before and during", slices.Sorted(maps.Keys(names)))
	}
}

// expect reads one event per want ("TYPE name"), in order, and fails on anything else.
func expect(t *testing.T, w *watching, want ...string) {
	t.Helper()
	for _, wanted := range want {
		ev := w.next()
		name := "-"
		if ev.Object != nil {
			name = ev.Object.Name
		}
		if got := fmt.Sprintf("%s %s", ev.Type, name); got != wanted {
			t.Fatalf("event %s, want %s (all expected: %v)", got, wanted, want)
		}
	}
}
