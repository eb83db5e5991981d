// Command configmap-controller is the Go SDK's example: a ConfigMap controller on the sidecar's work queue
// (the SDK's reconciler), which hands it work only while it leads; it writes through consistd fenced by
// the term each item was granted in, and tells a peer with ACK-tracked sends.
//
//	configmap-controller controller   campaign, and reconcile the watched ConfigMaps the queue hands out
//	                                  (only while LEADER): annotate each with its data keys, notify
//	                                  EXAMPLE_PEER
//	configmap-controller receive      print each notification peers send, and ACK it
//
// Environment: CONSISTD_SOCKET (the SDK's default), EXAMPLE_NAMESPACE (default "default"),
// EXAMPLE_ELECTION ("configmap-controller"; it also names the queue), EXAMPLE_PEER (whom to notify: a peer
// sidecar's "host:port", or "service/NAME" for every ready endpoint of the Service NAME in the sidecar's
// namespace; unset: nobody), EXAMPLE_EXIT_AFTER (exit 0 after this many handled; unset: run until SIGTERM
// or SIGINT, then resign and exit 0) and EXAMPLE_SELECTOR ("example.consistd.io/watch=true").
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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

// control campaigns in cfg.election and meanwhile works on the queue, which hands out work only while this
// sidecar leads. It returns nil once cfg.exitAfter ConfigMaps were handled; otherwise when ctx ends or the
// campaign or the queue fails, with what ended it. Either way it leaves the campaign (the sidecar resigns)
// and waits for the queue's passes before it returns.
func control(ctx context.Context, client *consistd.Client, cfg config) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	c := &controller{client: client, cfg: cfg, stop: stop}
	var reconcileErr error
	var reconciling sync.WaitGroup
	reconciling.Go(func() {
		reconcileErr = c.reconcile(ctx)
		stop() // without its queue the controller has nothing to lead for
	})
	campaignErr := campaign(ctx, client, cfg)
	stop()
	reconciling.Wait()
	switch {
	case c.finished():
		return nil
	case !errors.Is(reconcileErr, context.Canceled):
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

// controller reconciles the watched ConfigMaps; up to maxLeases at once, so handled is under mu.
type controller struct {
	client *consistd.Client
	cfg    config
	// stop ends control once cfg.exitAfter ConfigMaps were handled.
	stop    context.CancelFunc
	mu      sync.Mutex
	handled int
}

// maxLeases is how many ConfigMaps are reconciled at once.
const maxLeases = 4

// reconcile works on the queue of the ConfigMaps in cfg.namespace that match cfg.selector until ctx ends.
// The queue is named after the election (so controllers of other elections on one sidecar keep apart) and
// hands out work only while this sidecar leads it, each item with the term it was granted in.
func (c *controller) reconcile(ctx context.Context) error {
	spec := consistd.ReconcileSpec{
		Name:              c.cfg.election,
		Resource:          "configmaps",
		Namespace:         c.cfg.namespace,
		LabelSelector:     c.cfg.selector,
		MaxLeases:         maxLeases,
		Election:          c.cfg.election,
		ElectionNamespace: c.cfg.namespace,
	}
	if err := c.client.Reconcile(ctx, spec, consistd.ReconcilerFunc(c.handle)); err != nil {
		return fmt.Errorf("reconciling queue %s: %w", spec.Name, err)
	}
	return nil
}

// handle is the reconciler: it records a ConfigMap's data keys in its annotations (a write for the item:
// it names the lease and is guarded by the item's term) and notifies the peer. An error goes back to the
// queue, which hands the ConfigMap out again after a backoff.
func (c *controller) handle(ctx context.Context, item consistd.Item) (consistd.Result, error) {
	if item.Deleted || item.Object == nil {
		return consistd.Result{}, nil
	}
	fmt.Printf("reconciling %s/%s attempt=%d term=%d %s\n", item.Namespace, item.Name, item.Attempt, item.Term, item.Consistency)
	keys, observed, err := dataKeys(item.Object)
	if err != nil {
		return consistd.Result{}, consistd.TerminalError(err) // the same object will not decode better
	}
	joined := strings.Join(keys, ",")
	if seen, ok := observed[observedKeys]; ok && seen == joined {
		return consistd.Result{}, nil
	}
	patched, err := c.annotate(ctx, item, joined)
	if err != nil {
		return consistd.Result{}, err
	}
	fmt.Printf("patched %s/%s keys=%s resourceVersion=%s\n", patched.Namespace, patched.Name, joined, patched.ResourceVersion)
	if c.cfg.peer != "" {
		if err := c.notify(ctx, patched, keys); err != nil {
			return consistd.Result{}, err
		}
	}
	c.count()
	return consistd.Result{}, nil
}

// dataKeys decodes a ConfigMap: its data keys, sorted, and its annotations.
func dataKeys(obj *consistd.Object) ([]string, map[string]string, error) {
	var cm struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Data map[string]string `json:"data"`
	}
	if err := obj.Decode(&cm); err != nil {
		return nil, nil, fmt.Errorf("decoding configmap %s/%s: %w", obj.Namespace, obj.Name, err)
	}
	return slices.Sorted(maps.Keys(cm.Data)), cm.Metadata.Annotations, nil
}

// annotate merge-patches the item's ConfigMap with its observed keys, as a write for the item: it names
// the item's lease and is refused once this sidecar no longer leads in the item's term.
func (c *controller) annotate(ctx context.Context, item consistd.Item, joined string) (*consistd.Object, error) {
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]string{observedKeys: joined, handledBy: "go-example"}}}
	patched, err := c.client.Patch(ctx, "configmaps", item.Namespace, item.Name, consistd.MergePatch, patch, consistd.ForItem(item))
	if err != nil {
		return nil, fmt.Errorf("patching configmap %s/%s: %w", item.Namespace, item.Name, err)
	}
	return patched, nil
}

// count counts a handled ConfigMap and stops the controller at cfg.exitAfter.
func (c *controller) count() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handled++
	if c.cfg.exitAfter > 0 && c.handled == c.cfg.exitAfter {
		c.stop()
	}
}

// finished reports whether cfg.exitAfter ConfigMaps were handled.
func (c *controller) finished() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg.exitAfter > 0 && c.handled >= c.cfg.exitAfter
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
