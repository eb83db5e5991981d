// Measures N apps that each need the same ConfigMaps, side by side on the same control plane (`make bench`):
// every app running its own client-go informer, against every app subscribing to one consistd sidecar,
// which keeps one apiserver watch for all of them. For each side: the apiserver watches open on ConfigMaps,
// the apiserver's CPU over the run and its RSS, the apps' (and the sidecar's) RSS and CPU, and the events
// each app saw while the bench changed the ConfigMaps 10 times a second for 30 s.
//
//	informers run N              both sides with N app processes; prints table rows
//	informers informer NS        (child) a client-go ConfigMap informer on NS
//	informers memory NS MODE     (child of the memory bench, daemon/benches/memory.rs) a ConfigMap informer on
//	                             NS, MODE plain or transform (dropping managedFields, the usual transform):
//	                             prints "ready", starts on a line of stdin, prints "synced MS" once it holds
//	                             the list; on the next line a forced GC, then "collected" (the informer's
//	                             best case); ends when stdin closes
//
// The consistd side's apps are informers-app (./app, built beside this binary). Children print "synced" once
// they hold the initial state, and their event count when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	objects  = 50
	changes  = 300
	interval = 100 * time.Millisecond
)

func main() {
	switch {
	case len(os.Args) == 3 && os.Args[1] == "run":
		n, err := strconv.Atoi(os.Args[2])
		must(err)
		run(n)
	case len(os.Args) == 3 && os.Args[1] == "informer":
		informer(os.Args[2])
	case len(os.Args) == 4 && os.Args[1] == "memory":
		memory(os.Args[2], os.Args[3] == "transform")
	default:
		fmt.Fprintln(os.Stderr, "usage: informers run N | informer NS | memory NS plain|transform")
		os.Exit(2)
	}
}

func client() *kubernetes.Clientset {
	config, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	must(err)
	config.QPS, config.Burst = 1000, 1000
	return kubernetes.NewForConfigOrDie(config)
}

// informer runs one app's ConfigMap informer on ns until stdin closes, then prints its event count.
func informer(ns string) {
	ctx, cancel := context.WithCancel(context.Background())
	var events atomic.Int64
	factory := informers.NewSharedInformerFactoryWithOptions(client(), 0, informers.WithNamespace(ns))
	configMaps := factory.Core().V1().ConfigMaps().Informer()
	_, err := configMaps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, _ any) { events.Add(1) },
	})
	must(err)
	factory.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), configMaps.HasSynced) {
		fmt.Println("synced")
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	fmt.Printf("events %d\n", events.Load())
}

// memory holds ns's ConfigMaps in a client-go informer (without managedFields when transform) for the memory
// bench, which reads this process's RSS before it starts, once it has synced and after a forced GC.
func memory(ns string, transform bool) {
	options := []informers.SharedInformerOption{informers.WithNamespace(ns)}
	if transform {
		options = append(options, informers.WithTransform(func(obj any) (any, error) {
			if object, err := meta.Accessor(obj); err == nil {
				object.SetManagedFields(nil)
			}
			return obj, nil
		}))
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client(), 0, options...)
	configMaps := factory.Core().V1().ConfigMaps().Informer()
	stdin := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	_, err := stdin.ReadString('\n')
	must(err)
	ctx, cancel := context.WithCancel(context.Background())
	started := time.Now()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), configMaps.HasSynced) {
		panic("the informer did not sync")
	}
	fmt.Printf("synced %d\n", time.Since(started).Milliseconds())
	_, err = stdin.ReadString('\n')
	must(err)
	runtime.GC()
	debug.FreeOSMemory()
	fmt.Println("collected")
	_, _ = io.Copy(io.Discard, stdin)
	cancel()
}

// process is a running child (or the sidecar) whose resources are measured.
type process struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func start(name string, args ...string) *process {
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // no child outlives a failed bench
	stdin, err := cmd.StdinPipe()
	must(err)
	stdout, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	return &process{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
}

func (p *process) expect(prefix string) string {
	for p.lines.Scan() {
		if line := p.lines.Text(); strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(line, prefix))
		}
	}
	panic(fmt.Sprintf("child %d ended before %q", p.cmd.Process.Pid, prefix))
}

// usage is a process's user+system CPU seconds and resident memory in MiB, from /proc.
func usage(pid int) (cpu float64, rssMiB float64) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	must(err)
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	must(err)
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			rssMiB = kib / 1024
		}
	}
	return (utime + stime) / 100, rssMiB // /proc counts CPU in USER_HZ (1/100 s)
}

func apiserverPid() int {
	text, err := os.ReadFile(filepath.Join(filepath.Dir(os.Getenv("KUBECONFIG")), "apiserver.pid"))
	must(err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(text)))
	must(err)
	return pid
}

// configMapWatches is the number of watches on ConfigMaps the apiserver is serving now.
func configMapWatches(k *kubernetes.Clientset) float64 {
	body, err := k.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	must(err)
	total := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "apiserver_longrunning_requests{") && strings.Contains(line, `resource="configmaps"`) &&
			strings.Contains(line, `verb="WATCH"`) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			total += v
		}
	}
	return total
}

func run(n int) {
	k := client()
	ctx := context.Background()
	ns := fmt.Sprintf("informers-bench-%d", time.Now().UnixNano())
	_, err := k.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(err)
	defer func() { _ = k.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}) }()
	for i := range objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%02d", i)}, Data: map[string]string{"v": "0"}}
		_, err := k.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{})
		must(err)
	}
	self, err := os.Executable()
	must(err)
	fmt.Printf("%d apps watching %d ConfigMaps; %d changes at %d/s\n\n", n, objects, changes, time.Second/interval)
	fmt.Println("| side | apiserver watches on ConfigMaps | apiserver CPU during the changes | apiserver RSS | client RSS, total | client CPU during the changes | events per app, min / max |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- |")

	// client-go: an informer in every app.
	baseline := configMapWatches(k)
	apps := make([]*process, n)
	for i := range apps {
		apps[i] = start(self, "informer", ns)
	}
	measure(k, ns, "client-go informer in each app", baseline, apps, nil)

	// consistd: one sidecar, every app subscribing to it.
	baseline = configMapWatches(k)
	dir, err := os.MkdirTemp("", "informers-bench-")
	must(err)
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "consistd.sock")
	must(os.Setenv("CONSISTD_LOG_LEVEL", "warn"))
	must(os.WriteFile(filepath.Join(dir, "consistd.yaml"), []byte("identity: informers-bench\nnamespace: "+ns+"\n"), 0o644))
	sidecar := start(os.Getenv("CONSISTD_BIN"), "run", "--config", filepath.Join(dir, "consistd.yaml"), "--socket", socket,
		"--admin-socket", filepath.Join(dir, "admin.sock"), "--store-dir", filepath.Join(dir, "store"))
	for i := 0; ; i++ {
		if exec.Command(os.Getenv("CONSISTD_BIN"), "status", "--admin-socket", filepath.Join(dir, "admin.sock")).Run() == nil {
			break
		}
		if i > 150 {
			panic("consistd did not become ready")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for i := range apps {
		apps[i] = start(filepath.Join(filepath.Dir(self), "informers-app"), socket, ns)
	}
	measure(k, ns, "consistd shared by the apps", baseline, apps, sidecar)
	_ = sidecar.cmd.Process.Signal(os.Interrupt)
	_ = sidecar.cmd.Wait()
}

// measure waits until every app synced, changes the ConfigMaps, and prints the side's row. baseline is the
// apiserver's ConfigMap watches before the side started (its own, and nobody's in particular).
func measure(k *kubernetes.Clientset, ns, side string, baseline float64, apps []*process, sidecar *process) {
	for _, app := range apps {
		app.expect("synced")
	}
	time.Sleep(2 * time.Second)
	watches := configMapWatches(k) - baseline
	clients := apps
	if sidecar != nil {
		clients = append([]*process{sidecar}, apps...)
	}
	apiserverCPU, _ := usage(apiserverPid())
	clientCPU := 0.0
	for _, c := range clients {
		cpu, _ := usage(c.cmd.Process.Pid)
		clientCPU -= cpu
	}
	for i := range changes {
		patch, _ := json.Marshal(map[string]any{"data": map[string]string{"v": strconv.Itoa(i + 1)}})
		_, err := k.CoreV1().ConfigMaps(ns).Patch(context.Background(), fmt.Sprintf("cm-%02d", i%objects), types.MergePatchType, patch, metav1.PatchOptions{})
		must(err)
		time.Sleep(interval)
	}
	time.Sleep(2 * time.Second)
	cpu, apiserverRSS := usage(apiserverPid())
	apiserverCPU = cpu - apiserverCPU
	clientRSS, sidecarRSS := 0.0, 0.0
	for _, c := range clients {
		cpu, rss := usage(c.cmd.Process.Pid)
		clientCPU += cpu
		clientRSS += rss
		if c == sidecar {
			sidecarRSS = rss
		}
	}
	lowest, highest := changes+1, -1
	for _, app := range apps {
		_ = app.stdin.Close()
		got, err := strconv.Atoi(app.expect("events"))
		must(err)
		lowest, highest = min(lowest, got), max(highest, got)
		_ = app.cmd.Wait()
	}
	of := ""
	if sidecar != nil {
		of = fmt.Sprintf(" (the sidecar %.1f MiB)", sidecarRSS)
	}
	fmt.Printf("| %s | %.0f | %.2f s | %.0f MiB | %.0f MiB%s | %.2f s | %d / %d of %d |\n",
		side, watches, apiserverCPU, apiserverRSS, clientRSS, of, clientCPU, lowest, highest, changes)
	record("informers-watches", "apiserver watches on ConfigMaps", side, fmt.Sprintf("%d apps", len(apps)), watches)
	record("informers-rss", "client RSS, total MiB", side, fmt.Sprintf("%d apps", len(apps)), clientRSS)
	record("informers-apiserver-cpu", "apiserver CPU s during 30 s of changes", side, fmt.Sprintf("%d apps", len(apps)), apiserverCPU)
}

// record appends one chart point for hack/bench/charts.py to $CONSISTD_BENCH_FIGURES, as the Rust
// benchmarks do (testkit/src/figures.rs).
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
