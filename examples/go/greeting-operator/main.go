// Command greeting-operator is the Go SDK's example: the Greeting operator (examples/crd.yaml) on the
// sidecar's reconcile queue, which hands it Greetings only while it leads; it publishes each Greeting's
// message in a ConfigMap the Greeting owns, fenced by the term each item was granted in, and tells a peer
// with ACK-tracked sends.
//
//	greeting-operator controller   campaign, and reconcile the Greetings the queue hands out (only while
//	                               LEADER): apply each one's ConfigMap, record an event, notify
//	                               EXAMPLE_PEER, set Ready; delete the ConfigMap when the Greeting goes
//	greeting-operator receive      print each notification peers send, and ACK it
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE (default "default"),
// EXAMPLE_ELECTION ("greeting-operator"; it also names the queue), EXAMPLE_PEER (whom to notify: a peer
// sidecar's "host:port", or "service/NAME" for every ready endpoint of the Service NAME in the sidecar's
// namespace; unset: nobody) and, for receive only, EXAMPLE_EXIT_AFTER (exit 0 after this many received;
// unset: run until SIGTERM or SIGINT). Either command stops on SIGTERM or SIGINT, leaving the campaign (the
// sidecar resigns), and exits 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// stopSignals are the signals that stop the example, by name.
var stopSignals = map[os.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}

// config is the example's environment.
type config struct {
	namespace, election string
	// peer is EXAMPLE_PEER as given: a peer's "host:port", or "service/NAME"; empty: notify nobody.
	peer string
	// exitAfter is how many messages receive handles before it exits; 0 means no limit.
	exitAfter int
}

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "controller" && os.Args[1] != "receive") {
		fmt.Fprintln(os.Stderr, "usage: greeting-operator controller|receive")
		os.Exit(2)
	}
	cfg, err := configFromEnv()
	if err == nil {
		ctx, stop := stopOnSignal()
		defer stop()
		err = run(ctx, os.Args[1], cfg)
		if ctx.Err() != nil {
			// Stopped by a signal: the campaign was left (the sidecar resigned); what ended with it is no error.
			fmt.Println("stopped")
			err = nil
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "greeting-operator:", err)
		os.Exit(1)
	}
}

// stopOnSignal returns a context that ends at the first SIGTERM or SIGINT, after printing which one
// arrived. Everything run under it stops then; ending the campaign's stream resigns at once (the sidecar
// releases the Lease, so another replica leads without waiting for it to expire).
func stopOnSignal() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, slices.Collect(maps.Keys(stopSignals))...)
	go func() {
		select {
		case s := <-signals:
			fmt.Printf("stopping on %s\n", stopSignals[s])
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(signals)
		cancel()
	}
}

func configFromEnv() (config, error) {
	get := func(name, def string) string {
		if v := os.Getenv(name); v != "" {
			return v
		}
		return def
	}
	cfg := config{
		namespace: get("EXAMPLE_NAMESPACE", "default"),
		election:  get("EXAMPLE_ELECTION", "greeting-operator"),
		peer:      os.Getenv("EXAMPLE_PEER"),
	}
	if v := os.Getenv("EXAMPLE_EXIT_AFTER"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("EXAMPLE_EXIT_AFTER=%q is not a positive number", v)
		}
		cfg.exitAfter = n
	}
	return cfg, nil
}

func run(ctx context.Context, mode string, cfg config) error {
	client, err := consistd.New()
	if err != nil {
		return fmt.Errorf("connecting to the sidecar: %w", err)
	}
	defer client.Close()
	if err := client.WaitReady(ctx, 30*time.Second); err != nil {
		return fmt.Errorf("waiting for the sidecar to be ready: %w", err)
	}
	if mode == "receive" {
		return receive(ctx, client, cfg)
	}
	return control(ctx, client, cfg)
}

// control campaigns in cfg.election and meanwhile works on the operator's queue, which hands out work
// only while this sidecar leads. It returns when ctx ends or the campaign or the queue fails, with what
// ended it; either way it leaves the campaign (the sidecar resigns) and waits for the queue's passes.
func control(ctx context.Context, client *consistd.Client, cfg config) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	op := &operator{client: client, cfg: cfg}
	var reconcileErr error
	var reconciling sync.WaitGroup
	reconciling.Go(func() {
		reconcileErr = op.reconcile(ctx)
		stop() // without its queue the operator has nothing to lead for
	})
	campaignErr := campaign(ctx, client, cfg)
	stop()
	reconciling.Wait()
	if reconcileErr != nil && !errors.Is(reconcileErr, context.Canceled) {
		return reconcileErr
	}
	return campaignErr
}

// campaign makes this sidecar a candidate in cfg.election until ctx ends, printing each leadership state.
func campaign(ctx context.Context, client *consistd.Client, cfg config) error {
	for s := range client.Campaign(ctx, cfg.election, consistd.InNamespace(cfg.namespace)) {
		if s.Err != nil {
			return fmt.Errorf("campaigning in %s/%s: %w", cfg.namespace, cfg.election, s.Err)
		}
		fmt.Printf("leadership %s holder=%s term=%d\n", s.State, s.Holder, s.Term)
	}
	return ctx.Err()
}

// receive prints each message peers send; the SDK ACKs it when the handler returns. After
// cfg.exitAfter messages it stops, once the last ACK is stored.
func receive(ctx context.Context, client *consistd.Client, cfg config) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	received := 0
	return client.Inbox().Serve(ctx, func(_ context.Context, m *consistd.Message) error {
		fmt.Printf("received %s %s %s\n", m.ResourceID, m.EventID, m.Payload)
		received++
		if cfg.exitAfter > 0 && received >= cfg.exitAfter {
			stop()
		}
		return nil
	})
}
