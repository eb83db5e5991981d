// Measures client-go's own leader election on the same control plane, for comparison with consistd's
// (daemon/benches/leadership.rs, daemon/benches/scale.rs), with client-go's default timing (lease 15 s,
// renew deadline 10 s, retry 2 s). Run by `make bench`; prints table rows:
//
//	client-go-election           graceful handover with ReleaseOnCancel
//	client-go-election idle N    apiserver requests per second of N idle candidates in one election
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

const (
	handovers = 10
	idleFor   = 30 * time.Second
)

// requests counts every HTTP request the clients send to the apiserver.
var requests atomic.Int64

type counting struct{ next http.RoundTripper }

func (c counting) RoundTrip(r *http.Request) (*http.Response, error) {
	requests.Add(1)
	return c.next.RoundTrip(r)
}

func main() {
	klog.SetOutput(os.Stderr)
	config, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	must(err)
	config.QPS, config.Burst = 1000, 1000 // the default 5 QPS would throttle N candidates sharing a client
	config.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return counting{rt} }
	client := kubernetes.NewForConfigOrDie(config)
	ns := fmt.Sprintf("clientgo-bench-%d", time.Now().UnixNano())
	_, err = client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(err)

	leading := make(chan string, 16)
	start := func(id string) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: "bench", Namespace: ns},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		}
		go leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   15 * time.Second,
			RenewDeadline:   10 * time.Second,
			RetryPeriod:     2 * time.Second,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					select {
					case leading <- id:
					default:
					}
				},
				OnStoppedLeading: func() {},
			},
		})
		return cancel
	}
	if len(os.Args) == 3 && os.Args[1] == "idle" {
		n, err := strconv.Atoi(os.Args[2])
		must(err)
		for i := 0; i < n; i++ {
			start(fmt.Sprintf("c%d", i))
		}
		<-leading
		time.Sleep(5 * time.Second)
		before := requests.Load()
		time.Sleep(idleFor)
		rate := float64(requests.Load()-before) / idleFor.Seconds()
		fmt.Printf("| %d | client-go leader election, idle: %.2f req/s (%.3f per candidate) |\n", n, rate, rate/float64(n))
		record("idle-requests", "apiserver requests/s per idle daemon", "client-go: election only", float64(n), rate/float64(n))
		return
	}
	cancels := map[string]context.CancelFunc{"a": start("a"), "b": start("b")}
	leader := <-leading
	var took []float64
	for i := 0; i < handovers; i++ {
		began := time.Now()
		cancels[leader]()
		next := <-leading
		took = append(took, float64(time.Since(began).Microseconds())/1000)
		cancels[leader] = start(leader)
		leader = next
	}
	sort.Float64s(took)
	p := func(q float64) float64 { return took[int(float64(len(took)-1)*q+0.5)] }
	fmt.Printf("| client-go graceful handover (ReleaseOnCancel, same timing) | p50 %.3f | p99 %.3f | max %.3f (n=%d) |\n", p(0.5), p(0.99), took[len(took)-1], len(took))
	record("handover", "graceful handover p50, ms", "client-go", "2 candidates", p(0.5))
}

// record appends one chart point for hack/bench/charts.py to $CONSISTD_BENCH_FIGURES, as the Rust
// benchmarks do (testkit/src/figures.rs); x is a number or a label.
func record(chart, unit, series string, x any, y float64) {
	path := os.Getenv("CONSISTD_BENCH_FIGURES")
	if path == "" {
		return
	}
	line, err := json.Marshal(map[string]any{"chart": chart, "unit": unit, "series": series, "x": x, "y": y})
	must(err)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	must(err)
	defer f.Close()
	_, err = f.Write(append(line, '\n'))
	must(err)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
