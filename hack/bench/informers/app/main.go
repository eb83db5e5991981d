// One app of the informers benchmark's consistd side (hack/bench/informers): it watches the ConfigMaps of a
// namespace through its consistd sidecar with the Go SDK, prints "synced" once it holds the initial state and
// its event count when stdin closes. A binary of its own, as an app on consistd links no client-go.
//
//	informers-app SOCKET NAMESPACE
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: informers-app SOCKET NAMESPACE")
		os.Exit(2)
	}
	c, err := consistd.New(consistd.WithSocket(os.Args[1]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect to consistd:", err)
		os.Exit(1)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var events atomic.Int64
	go func() {
		request := consistd.WatchRequest{Resource: "configmaps", Namespace: os.Args[2], Mode: consistd.RawMode}
		for event, err := range c.Watch(ctx, request) {
			if err != nil {
				if ctx.Err() == nil {
					fmt.Fprintln(os.Stderr, "watch configmaps:", err)
				}
				return
			}
			switch event.Type {
			case consistd.Synced:
				fmt.Println("synced")
			case consistd.Modified:
				events.Add(1)
			}
		}
	}()
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	fmt.Printf("events %d\n", events.Load())
}
