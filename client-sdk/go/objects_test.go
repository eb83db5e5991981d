// Objects through the sidecar: answers larger than gRPC's default receive limit, and writes that would change
// nothing answered Unchanged.

package consistd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func TestAListAnswerLargerThan4MiBComesBackWhole(t *testing.T) {
	// gRPC clients refuse answers over 4 MiB by default; the SDK's connection takes any size the sidecar sends.
	c := ready(t, "")
	ns := freshNamespace(t, c)
	ctx := testContext(t)
	value := strings.Repeat("x", 900*1024)
	var names []string
	for i := range 6 {
		names = append(names, fmt.Sprintf("big-%d", i))
	}
	// No namespace controller runs in the test control plane: delete the ConfigMaps themselves (before
	// the namespace, as cleanups run last first).
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for _, name := range names {
			c.Delete(ctx, "configmaps", ns, name)
		}
	})
	for _, name := range names {
		if _, err := c.Create(ctx, "configmaps", ns, configMap(name, map[string]string{"v": value})); err != nil {
			t.Fatalf("creating configmap %s/%s: %v", ns, name, err)
		}
	}
	list, err := c.List(ctx, "configmaps", ns, "")
	if err != nil {
		t.Fatalf("listing the configmaps of %s: %v", ns, err)
	}
	var got []string
	size := 0
	for _, o := range list.Objects {
		got = append(got, o.Name)
		size += len(o.JSON)
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(o.JSON, &cm); err != nil {
			t.Fatalf("configmap %s: %v", o, err)
		}
		if len(cm.Data) != 1 || cm.Data["v"] != value {
			t.Fatalf("configmap %s came back without its full data (%d bytes of v)", o, len(cm.Data["v"]))
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("listed %v, want %v", got, names)
	}
	if size <= 4*1024*1024 {
		t.Fatalf("the objects' JSON adds up to %d bytes, want more than 4 MiB", size)
	}
}

// An Update or Patch the sidecar's synced watch cache shows would change nothing comes back Unchanged, the
// cached object, unless WithSendUnchanged sends it; a write that changes something never does. The sidecar
// answers a no-op write from a watch's cache only, so a watch of the namespace is open and synced first. Each
// answer is recorded as an own write: the change's state still reaches the watch, as OwnWrite.
func TestAWriteThatWouldChangeNothingComesBackUnchangedUnlessSentAnyway(t *testing.T) {
	c := ready(t, "")
	ns := freshNamespace(t, c)
	ctx := testContext(t)
	created, err := c.Create(ctx, "configmaps", ns, configMap("cfg", map[string]string{"a": "1"}))
	if err != nil {
		t.Fatal(err)
	}
	if created.Unchanged {
		t.Fatal("a create came back Unchanged")
	}
	w := watch(t, c, consistd.WatchRequest{Resource: "configmaps", Namespace: ns})
	w.initialState()
	same := map[string]any{"data": map[string]string{"a": "1"}}

	patched, err := c.Patch(ctx, "configmaps", ns, "cfg", consistd.MergePatch, same)
	if err != nil {
		t.Fatal(err)
	}
	if !patched.Unchanged || patched.ResourceVersion != created.ResourceVersion {
		t.Fatalf("a merge patch that changes nothing: Unchanged %t at %s, want true at the cached %s", patched.Unchanged, patched.ResourceVersion, created.ResourceVersion)
	}
	updated, err := c.Update(ctx, "configmaps", ns, "cfg", created.JSON)
	if err != nil {
		t.Fatal(err)
	}
	if !updated.Unchanged {
		t.Fatal("the object as created, written back, did not come back Unchanged")
	}
	if c.PredatesOwnWrite(updated) {
		t.Fatal("the cached object an unchanged write returned predates an own write")
	}

	sentPatch, err := c.Patch(ctx, "configmaps", ns, "cfg", consistd.MergePatch, same, consistd.WithSendUnchanged())
	if err != nil {
		t.Fatal(err)
	}
	sentUpdate, err := c.Update(ctx, "configmaps", ns, "cfg", created.JSON, consistd.WithSendUnchanged())
	if err != nil {
		t.Fatal(err)
	}
	if sentPatch.Unchanged || sentUpdate.Unchanged {
		t.Fatalf("WithSendUnchanged: the apiserver answers, never Unchanged (patch %t, update %t)", sentPatch.Unchanged, sentUpdate.Unchanged)
	}

	changed, err := c.Patch(ctx, "configmaps", ns, "cfg", consistd.MergePatch, map[string]any{"data": map[string]string{"a": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	if changed.Unchanged || changed.ResourceVersion == created.ResourceVersion {
		t.Fatalf("a patch that changes the object: Unchanged %t at %s", changed.Unchanged, changed.ResourceVersion)
	}
	for {
		ev := w.next()
		if ev.Object == nil || ev.Object.ResourceVersion != changed.ResourceVersion {
			continue
		}
		if ev.Type != consistd.Modified || ev.Consistency != consistd.OwnWrite || ev.Object.Unchanged {
			t.Fatalf("the change reached the watch as %s %s %s (Unchanged %t), want MODIFIED OWN_WRITE", ev.Type, describe(ev), ev.Consistency, ev.Object.Unchanged)
		}
		break
	}
	if got, err := c.Get(ctx, "configmaps", ns, "cfg"); err != nil || got.Unchanged {
		t.Fatalf("a read: %v, Unchanged %t", err, got != nil && got.Unchanged)
	}
}
