// Command configmap-controller is the Go SDK's example: a ConfigMap controller that acts only while it
// leads, writes through consistd fenced by its leadership term, and tells a peer with ACK-tracked sends.
//
//	configmap-controller controller   campaign; while LEADER, annotate each watched ConfigMap with its
//	                                  data keys and notify EXAMPLE_PEER
//	configmap-controller receive      print each notification peers send, and ACK it
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE (default "default"),
// EXAMPLE_ELECTION ("configmap-controller"), EXAMPLE_PEER (whom to notify: a peer sidecar's "host:port", or
// "service/NAME" for every ready endpoint of the Service NAME in the sidecar's namespace; unset: nobody),
// EXAMPLE_EXIT_AFTER (exit 0 after this many handled; unset: run until SIGTERM or SIGINT, then resign and
// exit 0) and EXAMPLE_SELECTOR ("example.consistd.io/watch=true").
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

const (
	observedKeys = "example.consistd.io/observed-keys"
	handledBy    = "example.consistd.io/handled-by"
)

// stopSignals are the signals that stop the example, by name.
var stopSignals = map[os.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT"}

// config is the example's environment.
type config struct {
	namespace, election, selector string
	// peer is EXAMPLE_PEER as given: a peer's "host:port", or "service/NAME"; empty: notify nobody.
	peer string
	// exitAfter is how many ConfigMaps (controller) or messages (receive) to handle; 0 means no limit.
	exitAfter int
}

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "controller" && os.Args[1] != "receive") {
		fmt.Fprintln(os.Stderr, "usage: configmap-controller controller|receive")
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
		fmt.Fprintln(os.Stderr, "configmap-controller:", err)
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
		election:  get("EXAMPLE_ELECTION", "configmap-controller"),
		peer:      os.Getenv("EXAMPLE_PEER"),
		selector:  get("EXAMPLE_SELECTOR", "example.consistd.io/watch=true"),
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
		return err
	}
	defer client.Close()
	if err := client.WaitReady(ctx, 30*time.Second); err != nil {
		return err
	}
	if mode == "receive" {
		return receive(ctx, client, cfg)
	}
	return control(ctx, client, cfg)
}

// control campaigns and, while this pod leads, reconciles the watched ConfigMaps; it returns once
// cfg.exitAfter ConfigMaps were handled.
func control(ctx context.Context, client *consistd.Client, cfg config) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	states := client.Campaign(ctx, cfg.election, consistd.InNamespace(cfg.namespace))
	c := &controller{client: client, cfg: cfg}
	finished := make(chan error, 1)
	var leading *term // the work of the term this pod leads in, if it leads
	for {
		select {
		case s, ok := <-states:
			if !ok {
				return ctx.Err()
			}
			if s.Err != nil {
				return s.Err
			}
			fmt.Printf("leadership %s holder=%s term=%d\n", s.State, s.Holder, s.Term)
			if leading != nil && (!s.IsLeader() || s.Term != leading.term) {
				leading.stop()
				leading = nil
				fmt.Println("stopped watching: no longer leader")
			}
			if leading == nil && s.IsLeader() {
				leading = c.lead(ctx, s.Term, finished)
			}
		case err := <-finished:
			return err
		}
	}
}

// term is the reconciliation running while this pod leads in one term.
type term struct {
	term    uint64
	cancel  context.CancelFunc
	stopped chan struct{}
}

// stop ends the term's work and waits until it has ended.
func (t *term) stop() {
	t.cancel()
	<-t.stopped
}

// controller reconciles ConfigMaps; handled counts across terms.
type controller struct {
	client  *consistd.Client
	cfg     config
	handled int
}

// lead starts reconciling as leader of term n; finished gets nil once cfg.exitAfter ConfigMaps were
// handled, or the error that ended the work (not when the term's work is stopped).
func (c *controller) lead(ctx context.Context, n uint64, finished chan<- error) *term {
	ctx, cancel := context.WithCancel(ctx)
	t := &term{term: n, cancel: cancel, stopped: make(chan struct{})}
	go func() {
		defer close(t.stopped)
		err := c.reconcile(ctx, n)
		if ctx.Err() == nil {
			finished <- err
		}
	}()
	return t
}

// reconcile watches the ConfigMaps in CONSISTENT mode and handles each added or changed one.
func (c *controller) reconcile(ctx context.Context, leaderTerm uint64) error {
	watch := consistd.WatchRequest{Resource: "configmaps", Namespace: c.cfg.namespace, LabelSelector: c.cfg.selector, Mode: consistd.ConsistentMode}
	fmt.Printf("watching configmaps in %s with %s\n", c.cfg.namespace, c.cfg.selector)
	for ev, err := range c.client.Watch(ctx, watch) {
		if err != nil {
			return err
		}
		if ev.Type != consistd.Added && ev.Type != consistd.Modified {
			continue
		}
		done, err := c.handle(ctx, ev.Object, leaderTerm)
		if err != nil {
			return err
		}
		if done {
			c.handled++
			if c.cfg.exitAfter > 0 && c.handled >= c.cfg.exitAfter {
				return nil
			}
		}
	}
	return nil
}

// handle records a ConfigMap's data keys in its annotation (guarded by the leadership term) and
// notifies the peer; it reports whether it patched.
func (c *controller) handle(ctx context.Context, obj *consistd.Object, leaderTerm uint64) (bool, error) {
	var cm struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := obj.Decode(&cm); err != nil {
		return false, fmt.Errorf("decoding configmap %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	keys := slices.Sorted(maps.Keys(cm.Data))
	joined := strings.Join(keys, ",")
	if seen, ok := cm.Metadata.Annotations[observedKeys]; ok && seen == joined {
		return false, nil
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{observedKeys: joined, handledBy: "go-example"}}}
	guard := consistd.WithGuard(consistd.Guard{Election: c.cfg.election, Namespace: c.cfg.namespace, Term: leaderTerm})
	patched, err := c.client.Patch(ctx, "configmaps", obj.Namespace, obj.Name, consistd.MergePatch, patch, guard)
	if status.Code(err) == codes.FailedPrecondition {
		// No longer leader in this term: the campaign will say so and stop this work.
		fmt.Fprintf(os.Stderr, "not patching %s/%s: %v\n", obj.Namespace, obj.Name, err)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("patching configmap %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	fmt.Printf("patched %s/%s keys=%s resourceVersion=%s\n", patched.Namespace, patched.Name, joined, patched.ResourceVersion)
	if c.cfg.peer == "" {
		return true, nil
	}
	return true, c.notify(ctx, patched, keys)
}

// notify tells the peer about a patched ConfigMap and waits for its receiver's ACK.
func (c *controller) notify(ctx context.Context, cm *consistd.Object, keys []string) error {
	payload, err := json.Marshal(struct {
		Namespace string   `json:"namespace"`
		Name      string   `json:"name"`
		Keys      []string `json:"keys"`
	}{cm.Namespace, cm.Name, keys})
	if err != nil {
		return err
	}
	sent, err := c.client.Send(ctx, consistd.SendRequest{
		To:          destination(c.cfg.peer),
		ResourceID:  "configmaps/" + cm.Namespace + "/" + cm.Name,
		EventID:     cm.ResourceVersion,
		Payload:     payload,
		ContentType: "application/json",
	})
	if err != nil {
		return fmt.Errorf("notifying %s: %w", c.cfg.peer, err)
	}
	outcome, err := sent.Wait(ctx)
	if err != nil {
		return fmt.Errorf("waiting for %s to ACK %s: %w", c.cfg.peer, sent.MessageID, err)
	}
	fmt.Printf("notified %s %s %s\n", c.cfg.peer, outcome.Kind, sent.MessageID)
	return nil
}

// destination is EXAMPLE_PEER as a destination: "service/NAME" is every ready endpoint of the Service NAME
// in the sidecar's namespace (the sidecar follows its EndpointSlices), anything else one peer's "host:port".
func destination(peer string) consistd.Destination {
	if name, ok := strings.CutPrefix(peer, "service/"); ok {
		return consistd.ToService("", name)
	}
	return consistd.ToPeer(peer)
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
