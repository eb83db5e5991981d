// The Greeting reconciler: publishes a Greeting's message in the ConfigMap it owns, or deletes that when the
// Greeting goes.

package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

const (
	// finalizer holds a Greeting until its ConfigMap is deleted.
	finalizer = "example.consistd.io/cleanup"
	// managedBy labels the ConfigMaps the operator made, with operatorName.
	managedBy    = "app.kubernetes.io/managed-by"
	operatorName = "greeting-operator"
)

// GreetingReconciler reconciles Greetings.
type GreetingReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=example.consistd.io,resources=greetings,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=example.consistd.io,resources=greetings/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile keeps the finalizer on the Greeting, creates or updates its ConfigMap, records the Published event
// when it did, and sets the Ready condition; for a Greeting being deleted it deletes the ConfigMap first.
func (r *GreetingReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var greeting Greeting
	if err := r.Get(ctx, req.NamespacedName, &greeting); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !greeting.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &greeting)
	}
	// The consistd examples' line. controller-runtime hands the reconciler no attempt count, leadership term
	// or consistency: attempt=0, term=0 and UNSPECIFIED are fixed placeholders.
	fmt.Printf("reconciling %s attempt=0 term=0 UNSPECIFIED\n", req.NamespacedName)

	if controllerutil.AddFinalizer(&greeting, finalizer) {
		if err := r.Update(ctx, &greeting); err != nil {
			return ctrl.Result{}, fmt.Errorf("add the finalizer to Greeting %s: %w", req.NamespacedName, err)
		}
	}

	configMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: greeting.Name, Namespace: greeting.Namespace}}
	result, err := controllerutil.CreateOrUpdate(ctx, r.Client, configMap, func() error {
		if configMap.Labels == nil {
			configMap.Labels = map[string]string{}
		}
		configMap.Labels[managedBy] = operatorName
		configMap.Data = map[string]string{"message": greeting.Spec.Message}
		return controllerutil.SetControllerReference(&greeting, configMap, r.Scheme)
	})
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("create or update ConfigMap %s: %w", req.NamespacedName, err)
	}
	note := fmt.Sprintf("ConfigMap %s holds the message", configMap.Name)
	if result != controllerutil.OperationResultNone {
		fmt.Printf("published %s generation=%d configmap=%s resourceVersion=%s\n",
			req.NamespacedName, greeting.Generation, configMap.Name, configMap.ResourceVersion)
		r.Recorder.Eventf(&greeting, nil, corev1.EventTypeNormal, "Published", "Publish", "%s", note)
	}

	ready := metav1.Condition{
		Type:               "Ready",
		Status:             metav1.ConditionTrue,
		Reason:             "Published",
		Message:            note,
		ObservedGeneration: greeting.Generation,
	}
	if meta.SetStatusCondition(&greeting.Status.Conditions, ready) {
		if err := r.Status().Update(ctx, &greeting); err != nil {
			return ctrl.Result{}, fmt.Errorf("set the Ready condition of Greeting %s: %w", req.NamespacedName, err)
		}
	}
	return ctrl.Result{}, nil
}

// finalize deletes the Greeting's ConfigMap (already gone is fine), then removes the finalizer.
func (r *GreetingReconciler) finalize(ctx context.Context, greeting *Greeting) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(greeting, finalizer) {
		return ctrl.Result{}, nil
	}
	key := client.ObjectKeyFromObject(greeting)
	// controller-runtime has no leadership term: term=0 is a fixed placeholder.
	fmt.Printf("finalizing %s term=0\n", key)
	configMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: greeting.Name, Namespace: greeting.Namespace}}
	if err := r.Delete(ctx, configMap); client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, fmt.Errorf("delete ConfigMap %s: %w", key, err)
	}
	fmt.Printf("finalized %s\n", key)
	controllerutil.RemoveFinalizer(greeting, finalizer)
	if err := r.Update(ctx, greeting); err != nil {
		return ctrl.Result{}, fmt.Errorf("remove the finalizer from Greeting %s: %w", key, err)
	}
	return ctrl.Result{}, nil
}

// SetupWithManager watches the Greetings whose generation moved (a change of status, labels, annotations or
// finalizers alone queues nothing) and the ConfigMaps they own.
func (r *GreetingReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&Greeting{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.ConfigMap{}).
		Named("greeting").
		Complete(r)
}
