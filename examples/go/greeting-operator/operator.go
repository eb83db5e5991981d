// The Greeting operator's reconcile queue and its handler: publish each Greeting's message in a ConfigMap it
// owns, and delete that ConfigMap in the Greeting's finalize pass.

package main

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

const (
	greetings = "greetings.example.consistd.io"
	// fieldManager is the ConfigMap's server-side apply field manager, and its managedByLabel's value.
	fieldManager   = "greeting-operator"
	managedByLabel = "app.kubernetes.io/managed-by"
	finalizer      = "example.consistd.io/cleanup"
	// maxLeases is how many Greetings are reconciled at once.
	maxLeases = 4
)

// operator reconciles the Greetings in cfg.namespace.
type operator struct {
	client *consistd.Client
	cfg    config
}

// greeting is what the operator reads of a Greeting.
type greeting struct {
	Metadata struct {
		Generation int64 `json:"generation"`
	} `json:"metadata"`
	Spec struct {
		Message string `json:"message"`
	} `json:"spec"`
}

// configMap is what the operator reads of a Greeting's ConfigMap.
type configMap struct {
	Metadata struct {
		OwnerReferences []struct {
			UID        string `json:"uid"`
			Controller bool   `json:"controller"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
}

// reconcile works on the queue of the Greetings in cfg.namespace until ctx ends. The queue is named after the
// election (so operators of other elections on one sidecar keep apart), hands out work only while this
// sidecar leads it, each item with the term it was granted in, and keeps the finalizer on each Greeting.
// Only a change of a Greeting's spec (its generation) queues it, or a change by anyone else of the ConfigMap
// it controls.
func (op *operator) reconcile(ctx context.Context) error {
	spec := consistd.ReconcileSpec{
		Name:      op.cfg.election,
		Resource:  greetings,
		Namespace: op.cfg.namespace,
		Changes:   consistd.Changes{Generation: true},
		Related: []consistd.Related{{
			Resource:        "configmaps",
			Namespace:       op.cfg.namespace,
			LabelSelector:   managedByLabel + "=" + fieldManager,
			ControllerOwner: true,
		}},
		Finalizer:         finalizer,
		MaxLeases:         maxLeases,
		Election:          op.cfg.election,
		ElectionNamespace: op.cfg.namespace,
	}
	if err := op.client.Reconcile(ctx, spec, consistd.ReconcilerFunc(op.handle)); err != nil {
		return fmt.Errorf("reconciling queue %s: %w", spec.Name, err)
	}
	return nil
}

// handle is one pass over a Greeting. An error goes back to the queue, which hands the Greeting out again
// after a backoff.
func (op *operator) handle(ctx context.Context, item consistd.Item) (consistd.Result, error) {
	switch {
	case item.Finalizing:
		return consistd.Result{}, op.finalize(ctx, item)
	case item.Deleted || item.Object == nil:
		return consistd.Result{}, nil // gone (after its finalize pass), or named by a ConfigMap only
	}
	fmt.Printf("reconciling %s attempt=%d term=%d %s\n", item, item.Attempt, item.Term, item.Consistency)
	var g greeting
	if err := item.Object.Decode(&g); err != nil {
		// The same object will not decode better.
		return consistd.Result{}, consistd.TerminalError(fmt.Errorf("decoding greeting %s: %w", item, err))
	}
	held, err := op.holdsMessage(ctx, item, g.Spec.Message)
	if err != nil {
		return consistd.Result{}, err
	}
	note := fmt.Sprintf("ConfigMap %s holds the message", item.Name)
	if !held {
		if err := op.publish(ctx, item, g, note); err != nil {
			return consistd.Result{}, err
		}
	}
	_, err = item.SetCondition(ctx, consistd.Condition{
		Type: "Ready", Status: consistd.ConditionTrue, Reason: "Published", Message: note,
	})
	if err != nil {
		return consistd.Result{}, fmt.Errorf("setting Ready on greeting %s: %w", item, err)
	}
	return consistd.Result{}, nil
}

// holdsMessage reports whether the Greeting's ConfigMap already says message and names the Greeting as its
// controller; an absent ConfigMap does not.
func (op *operator) holdsMessage(ctx context.Context, item consistd.Item, message string) (bool, error) {
	obj, err := op.client.Get(ctx, "configmaps", item.Namespace, item.Name)
	if status.Code(err) == codes.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading configmap %s: %w", item, err)
	}
	var cm configMap
	if err := obj.Decode(&cm); err != nil {
		return false, fmt.Errorf("decoding configmap %s: %w", item, err)
	}
	if cm.Data["message"] != message {
		return false, nil
	}
	for _, ref := range cm.Metadata.OwnerReferences {
		if ref.Controller && ref.UID == item.Object.UID {
			return true, nil
		}
	}
	return false, nil
}

// publish applies the Greeting's ConfigMap, records the Published event on the Greeting and notifies the
// peer. The apply is made for the item: it names the lease (so it queues no further pass) and is guarded by
// the item's term, so a deposed leader's late write is refused.
func (op *operator) publish(ctx context.Context, item consistd.Item, g greeting, note string) error {
	cm := map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name":      item.Name,
			"namespace": item.Namespace,
			"labels":    map[string]string{managedByLabel: fieldManager},
			"ownerReferences": []map[string]any{{
				"apiVersion": "example.consistd.io/v1",
				"kind":       "Greeting",
				"name":       item.Name,
				"uid":        item.Object.UID,
				"controller": true,
			}},
		},
		"data": map[string]string{"message": g.Spec.Message},
	}
	applied, err := op.client.Patch(ctx, "configmaps", item.Namespace, item.Name, consistd.ApplyPatch, cm,
		consistd.WithFieldManager(fieldManager), consistd.WithForce(), consistd.ForItem(item))
	if err != nil {
		return fmt.Errorf("applying configmap %s: %w", item, err)
	}
	fmt.Printf("published %s generation=%d configmap=%s resourceVersion=%s\n",
		item, g.Metadata.Generation, applied.Name, applied.ResourceVersion)
	// false: client-go's rate limit dropped the event, which is no reason to fail the pass.
	_, err = item.RecordEvent(ctx, consistd.EventRecord{
		Severity: consistd.EventNormal, Reason: "Published", Action: "Publish", Note: note,
	})
	if err != nil {
		return fmt.Errorf("recording the Published event on greeting %s: %w", item, err)
	}
	if op.cfg.peer == "" {
		return nil
	}
	return notify(ctx, op.client, op.cfg.peer, applied, g.Spec.Message)
}

// finalize deletes the ConfigMap of a Greeting being deleted (made for the item, so guarded by its term);
// returning nil lets the sidecar remove the finalizer.
func (op *operator) finalize(ctx context.Context, item consistd.Item) error {
	fmt.Printf("finalizing %s term=%d\n", item, item.Term)
	_, err := op.client.Delete(ctx, "configmaps", item.Namespace, item.Name, consistd.ForItem(item))
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("deleting configmap %s: %w", item, err)
	}
	fmt.Printf("finalized %s\n", item)
	return nil
}
