// The Greeting operator of examples/README.md written on controller-runtime, as its docs and kubebuilder's
// scaffold teach it: a manager whose cache holds the Greetings of EXAMPLE_NAMESPACE (default "default") and
// the ConfigMaps the operator labels, and one controller (greeting_controller.go). It prints the consistd
// examples' `reconciling`, `published`, `finalizing` and `finalized` lines on stdout (its logs go to stderr),
// so daemon/benches/operator.rs counts its passes as it counts theirs. It sends no notification (a consistd
// feature); leader election is off unless --leader-elect is given.
//
//	KUBECONFIG=... EXAMPLE_NAMESPACE=NS controller-runtime-greeting-operator [--leader-elect]
package main

import (
	"flag"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	var leaderElect bool
	var metricsAddr string
	flag.BoolVar(&leaderElect, "leader-elect", false, "Campaign for the Lease greeting-operator and reconcile only while leading.")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "Where to serve metrics (0: not at all).")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	namespace := os.Getenv("EXAMPLE_NAMESPACE")
	if namespace == "" {
		namespace = "default"
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		log.Error(err, "register the built-in types")
		os.Exit(1)
	}
	if err := SchemeBuilder.AddToScheme(scheme); err != nil {
		log.Error(err, "register the Greeting types")
		os.Exit(1)
	}

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme: scheme,
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{namespace: {}},
			ByObject: map[client.Object]cache.ByObject{
				&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{managedBy: operatorName})},
			},
		},
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		LeaderElection:          leaderElect,
		LeaderElectionID:        operatorName,
		LeaderElectionNamespace: namespace,
	})
	if err != nil {
		log.Error(err, "create the manager")
		os.Exit(1)
	}
	reconciler := &GreetingReconciler{
		Client:   mgr.GetClient(),
		Scheme:   mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder(operatorName),
	}
	if err := reconciler.SetupWithManager(mgr); err != nil {
		log.Error(err, "create the Greeting controller")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "run the manager")
		os.Exit(1)
	}
}
