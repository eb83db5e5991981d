// Objects through the sidecar: answers larger than gRPC's default receive limit.

package consistd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
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
