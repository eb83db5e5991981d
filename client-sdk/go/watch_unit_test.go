// Unit tests of the watch request without a daemon: the view goes out as asked, on the first Subscribe and
// on each one after a lost connection, with the fake watch stream of ownwrites_test.go.

package consistd

import (
	"context"
	"iter"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// subscribeWith watches with view over the fake's streams, takes events events, and returns the requests
// each Subscribe was called with.
func subscribeWith(t *testing.T, view View, events int, streams ...[]*pb.SubscribeResponse) []*pb.SubscribeRequest {
	t.Helper()
	c, w, _ := fakeClient(streams...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next, stop := iter.Pull2(c.Watch(ctx, WatchRequest{Resource: "deployments.apps", Namespace: "ns", View: view}))
	defer stop()
	for range events {
		if _, err, ok := next(); !ok || err != nil {
			t.Fatalf("no event (error %v)", err)
		}
	}
	return w.subscribed()
}

func TestAWatchSendsItsViewOnEverySubscribeAndNoneWhenZero(t *testing.T) {
	fields := []string{"spec.replicas", "metadata.labels"}
	for _, c := range []struct {
		name string
		view View
		want *pb.ObjectView
	}{
		{"zero", View{}, nil},
		{"metadata only", View{MetadataOnly: true}, &pb.ObjectView{MetadataOnly: true}},
		{"projection with managed fields", View{Fields: fields, ManagedFields: true}, &pb.ObjectView{Fields: fields, ManagedFields: true}},
	} {
		// The first stream is cut after two events: the second Subscribe resumes with the same view.
		requests := subscribeWith(t, c.view, 3,
			[]*pb.SubscribeResponse{event(added, kube("u", "5"), "c1"), event(synced, nil, "c2")},
			[]*pb.SubscribeResponse{event(modified, kube("u", "6"), "c3")})
		if len(requests) != 2 {
			t.Fatalf("%s: %d subscribes, want 2", c.name, len(requests))
		}
		for i, r := range requests {
			if !proto.Equal(r.GetView(), c.want) || (c.want == nil && r.View != nil) {
				t.Errorf("%s: subscribe %d has view %v, want %v", c.name, i, r.GetView(), c.want)
			}
		}
		if got := requests[1].GetResumeCursor(); got != "c2" {
			t.Errorf("%s: resumed from %q, want c2", c.name, got)
		}
	}
}

func TestAWatchsViewIsItsOwnCopyOfTheFields(t *testing.T) {
	fields := []string{"spec.replicas"}
	c, w, _ := fakeClient(
		[]*pb.SubscribeResponse{event(added, kube("u", "5"), "c1")},
		[]*pb.SubscribeResponse{event(modified, kube("u", "6"), "c2")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next, stop := iter.Pull2(c.Watch(ctx, WatchRequest{Resource: "deployments.apps", View: View{Fields: fields}}))
	defer stop()
	if _, err, _ := next(); err != nil {
		t.Fatal(err)
	}
	fields[0] = "status" // the caller reuses its slice; the reconnect below must not see it
	if _, err, _ := next(); err != nil {
		t.Fatal(err)
	}
	for i, r := range w.subscribed() {
		if got := r.GetView().GetFields(); len(got) != 1 || got[0] != "spec.replicas" {
			t.Errorf("subscribe %d has fields %q, want [spec.replicas]", i, got)
		}
	}
}

func TestAnEventCarriesThePreviousResourceVersionTheDaemonNamed(t *testing.T) {
	on := event(modified, kube("u", "6"), "c2")
	on.PreviousResourceVersion = "5"
	c, _, _ := fakeClient([]*pb.SubscribeResponse{event(added, kube("u", "5"), "c1"), on})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	next, stop := iter.Pull2(c.Watch(ctx, WatchRequest{Resource: "configmaps", Namespace: "ns"}))
	defer stop()
	for _, want := range []string{"", "5"} {
		ev, err, ok := next()
		if !ok || err != nil {
			t.Fatalf("no event (error %v)", err)
		}
		if ev.PreviousResourceVersion != want {
			t.Errorf("%s %s: previous %q, want %q", ev.Type, ev.Object.ResourceVersion, ev.PreviousResourceVersion, want)
		}
	}
}
