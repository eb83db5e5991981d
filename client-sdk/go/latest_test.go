// Tests of the newest state per object (WatchLatest) against the daemons: a worker holds an object while
// a third party (through daemon b) changes it, writes it itself, and is done; the next worker is handed the
// write's own state, never the third party's older one.

package consistd_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func TestAWorkerIsHandedTheNewestStateAndNeverOneOlderThanItsOwnWrite(t *testing.T) {
	app := ready(t, "")
	ns := freshNamespace(t, app)
	other := ready(t, env(t, "CONSISTD_TEST_PEER_SOCKET"))
	created := mustCreate(t, app, ns, "slow")
	ctx := testContext(t)
	latest := app.WatchLatest(ctx, consistd.WatchRequest{Resource: "configmaps", Namespace: ns})
	defer latest.Close()
	next := func() *consistd.Taken {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		taken, err := latest.Next(ctx)
		if err != nil {
			t.Fatalf("no state handed out: %v", err)
		}
		return taken
	}

	first := next()
	if first.Event.Type != consistd.Added || first.Name() != "slow" || first.Namespace() != ns || first.Event.Object.ResourceVersion != created.ResourceVersion {
		t.Fatalf("handed out %s %s, want ADDED slow@%s", first.Event.Type, describe(first.Event), created.ResourceVersion)
	}
	// Another writer changes it twice while the worker works: both states reach the client and wait there.
	for _, v := range []string{"1", "2"} {
		if _, err := other.Patch(ctx, "configmaps", ns, "slow", consistd.MergePatch, []byte(`{"data":{"k":"`+v+`"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(arrived)
	early, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	if taken, err := latest.Next(early); err == nil {
		t.Fatalf("handed out %s while the worker holds it", describe(taken.Event))
	}
	cancel()
	if n := latest.Pending(); n != 1 {
		t.Fatalf("%d states pending, want the newest only", n)
	}
	mine, err := app.Patch(ctx, "configmaps", ns, "slow", consistd.MergePatch, []byte(`{"data":{"k":"mine"}}`))
	if err != nil {
		t.Fatal(err)
	}
	first.Done()
	second := next()
	if second.Event.Type != consistd.Modified || second.Event.Object.ResourceVersion != mine.ResourceVersion {
		t.Fatalf("handed out %s %s after the worker's own write returned %s", second.Event.Type, describe(second.Event), mine.ResourceVersion)
	}
	second.Done()
	if _, err := other.Delete(ctx, "configmaps", ns, "slow"); err != nil {
		t.Fatal(err)
	}
	if gone := next(); gone.Event.Type != consistd.Deleted || gone.Name() != "slow" {
		t.Fatalf("handed out %s %s, want the deletion", gone.Event.Type, describe(gone.Event))
	}
}

func TestTheErrorThatEndsANewestStateWatchReachesTheWorker(t *testing.T) {
	app := ready(t, "")
	latest := app.WatchLatest(testContext(t), consistd.WatchRequest{Resource: "nosuchthings", Namespace: "default"})
	defer latest.Close()
	ctx, cancel := context.WithTimeout(testContext(t), 15*time.Second)
	defer cancel()
	if _, err := latest.Next(ctx); status.Code(err) != codes.NotFound {
		t.Fatalf("Next = %v, want NOT_FOUND", err)
	}
}
