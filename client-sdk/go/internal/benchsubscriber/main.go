// Command benchsubscriber measures how fast one Go SDK subscriber receives a namespace's ConfigMaps: per
// round it watches them in RAW mode from a fresh snapshot and counts events until SYNCED, printing
//
//	{"language":"go","events":5000,"seconds":0.842}
//
// on stdout (seconds from just before subscribing to SYNCED). Run by `hack/sdk/go.sh bench-subscriber
// NAMESPACE ROUNDS` against CONSISTD_SOCKET; anything else goes to stderr.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// round is one line of output.
type round struct {
	Language string  `json:"language"`
	Events   int     `json:"events"`
	Seconds  float64 `json:"seconds"`
}

func main() {
	rounds, err := strconv.Atoi(os.Args[len(os.Args)-1])
	if len(os.Args) != 3 || err != nil || rounds < 1 {
		fmt.Fprintln(os.Stderr, "usage: benchsubscriber NAMESPACE ROUNDS")
		os.Exit(2)
	}
	if err := run(os.Args[1], rounds); err != nil {
		fmt.Fprintln(os.Stderr, "benchsubscriber:", err)
		os.Exit(1)
	}
}

func run(namespace string, rounds int) error {
	ctx := context.Background()
	client, err := consistd.New()
	if err != nil {
		return err
	}
	defer client.Close()
	if err := client.WaitReady(ctx, 30*time.Second); err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	for range rounds {
		r, err := measure(ctx, client, namespace)
		if err != nil {
			return err
		}
		if err := out.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// measure subscribes once and counts the events of the initial state up to SYNCED.
func measure(ctx context.Context, client *consistd.Client, namespace string) (round, error) {
	start := time.Now()
	events := 0
	for ev, err := range client.Watch(ctx, consistd.WatchRequest{Resource: "configmaps", Namespace: namespace, Mode: consistd.RawMode}) {
		if err != nil {
			return round{}, err
		}
		if ev.Type == consistd.Synced {
			seconds := math.Round(time.Since(start).Seconds()*1000) / 1000
			return round{Language: "go", Events: events, Seconds: seconds}, nil
		}
		events++
	}
	return round{}, fmt.Errorf("the watch of %s ended before SYNCED", namespace)
}
