// Command benchsend measures Send -> ACKED latency through the Go SDK at a steady rate between
// hack/with-daemons.sh's two daemons: it sends MESSAGES messages of 1 KiB (each about a resource of its
// own) from daemon a (CONSISTD_SOCKET) to daemon b's peer address (CONSISTD_TEST_PEER_ADDRESS), paced
// at RATE per second, while RECEIVERS Inbox.Serve calls on a client of daemon b
// (CONSISTD_TEST_PEER_SOCKET) ACK each (one Serve handles one message at a time and waits for its ACK to
// be stored before the next, so one alone falls behind 1,000/s on a slow disk). A message's latency runs from the Send call to Sent.Wait returning ACKED. A warm-up of
// WARMUP messages at the same rate goes first and is reported on its own line. One JSON line per phase:
//
//	{"language":"go","phase":"measured","messages":10000,"rate":1000,"acked":10000,"p50_ms":1.1,...}
//
// Run by `hack/sdk/go.sh bench-send [MESSAGES [RATE [WARMUP [RECEIVERS]]]]` (defaults 10000, 1000,
// 2000, 16) under
// hack/with-daemons.sh; the Java SDK's counterpart is client-sdk/java's bench.BenchSend.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// result is one line of output.
type result struct {
	Language    string  `json:"language"`
	Phase       string  `json:"phase"`
	Messages    int     `json:"messages"`
	Rate        int     `json:"rate"`
	Receivers   int     `json:"receivers"`
	SendSeconds float64 `json:"send_seconds"`
	Acked       int64   `json:"acked"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	Max         float64 `json:"max_ms"`
}

var payload = bytes.Repeat([]byte("x"), 1024)

func main() {
	args := []int{10_000, 1_000, 2_000, 16}
	for i, a := range os.Args[1:] {
		n, err := strconv.Atoi(a)
		if i >= len(args) || err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "usage: benchsend [MESSAGES [RATE [WARMUP [RECEIVERS]]]]")
			os.Exit(2)
		}
		args[i] = n
	}
	if err := run(args[0], args[1], args[2], args[3]); err != nil {
		fmt.Fprintln(os.Stderr, "benchsend:", err)
		os.Exit(1)
	}
}

func env(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set: run under hack/with-daemons.sh", name)
	}
	return v, nil
}

func run(messages, rate, warmup, receivers int) error {
	ctx := context.Background()
	peer, err := env("CONSISTD_TEST_PEER_ADDRESS")
	if err != nil {
		return err
	}
	peerSocket, err := env("CONSISTD_TEST_PEER_SOCKET")
	if err != nil {
		return err
	}
	a, err := consistd.New()
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := consistd.New(consistd.WithSocket(peerSocket))
	if err != nil {
		return err
	}
	defer b.Close()
	for _, c := range []*consistd.Client{a, b} {
		if err := c.WaitReady(ctx, 30*time.Second); err != nil {
			return err
		}
	}
	serveCtx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, receivers)
	for range receivers {
		go func() {
			served <- b.Inbox().Serve(serveCtx, func(context.Context, *consistd.Message) error { return nil })
		}()
	}
	time.Sleep(200 * time.Millisecond) // the Receive calls open before the first send
	// Resource ids of this run's own, so a second run against the same daemons supersedes nothing.
	run := "go-" + strconv.FormatInt(time.Now().UnixMilli(), 36)
	out := json.NewEncoder(os.Stdout)
	if warmup > 0 {
		r, err := phase(ctx, a, peer, run+"-warmup", "warm-up", warmup, rate, receivers)
		if err != nil {
			return err
		}
		if err := out.Encode(r); err != nil {
			return err
		}
	}
	r, err := phase(ctx, a, peer, run, "measured", messages, rate, receivers)
	if err != nil {
		return err
	}
	if err := out.Encode(r); err != nil {
		return err
	}
	stop()
	for range receivers {
		if err := <-served; err != nil {
			return err
		}
	}
	return nil
}

// phase sends n messages at rate per second and waits for every outcome.
func phase(ctx context.Context, a *consistd.Client, peer, prefix, name string, n, rate, receivers int) (result, error) {
	latencies := make([]float64, n)
	var acked atomic.Int64
	var wg sync.WaitGroup
	period := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		// Paced by absolute deadlines: a late tick is made up at once (a burst), as the daemon's bench does.
		time.Sleep(time.Until(start.Add(time.Duration(i) * period)))
		req := consistd.SendRequest{
			To: consistd.ToPeer(peer), ResourceID: prefix + "-" + strconv.Itoa(i), EventID: "1",
			Payload: payload, ContentType: "application/octet-stream",
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			sent, err := a.Send(waitCtx, req)
			var o consistd.Outcome
			if err == nil {
				o, err = sent.Wait(waitCtx)
			}
			latencies[i] = float64(time.Since(t0).Nanoseconds()) / 1e6
			switch {
			case err != nil:
				fmt.Fprintf(os.Stderr, "message %d: %v\n", i, err)
			case !o.IsAcked():
				fmt.Fprintf(os.Stderr, "message %d: %s %s\n", i, o.Kind, o.Reason)
			default:
				acked.Add(1)
			}
		}()
	}
	sendSeconds := time.Since(start).Seconds()
	wg.Wait()
	slices.Sort(latencies)
	q := func(p float64) float64 {
		// Nearest rank, as testkit's figures::quantile.
		v := latencies[int(math.Round(float64(len(latencies)-1)*p))]
		return math.Round(v*1000) / 1000
	}
	return result{
		Language: "go", Phase: name, Messages: n, Rate: rate, Receivers: receivers, SendSeconds: math.Round(sendSeconds*1000) / 1000,
		Acked: acked.Load(), P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: q(1),
	}, nil
}
