// Test fixtures that break connections: a Unix-socket proxy that can cut every connection, and a daemon
// of the test's own that can be restarted.

package consistd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proxy forwards connections from its own socket to a daemon's; it can cut them all and refuse new ones
// for a while.
type proxy struct {
	Socket   string
	target   string
	listener net.Listener
	mu       sync.Mutex
	conns    []net.Conn
	accepted int
	// refusing closes new connections at once (between down and up).
	refusing bool
}

// startProxy listens on a socket in a temporary directory and forwards to target until the test ends.
func startProxy(t *testing.T, target string) *proxy {
	p := &proxy{Socket: filepath.Join(t.TempDir(), "proxy.sock"), target: target}
	l, err := net.Listen("unix", p.Socket)
	if err != nil {
		t.Fatal(err)
	}
	p.listener = l
	go p.serve()
	t.Cleanup(func() {
		l.Close()
		p.cut()
	})
	return p
}

func (p *proxy) serve() {
	for {
		in, err := p.listener.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refusing := p.refusing
		p.mu.Unlock()
		if refusing {
			in.Close()
			continue
		}
		out, err := net.Dial("unix", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.accepted++
		p.mu.Unlock()
		go pipe(in, out)
		go pipe(out, in)
	}
}

// pipe copies one direction and closes both ends when it ends.
func pipe(dst, src net.Conn) {
	io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cut closes every connection through the proxy; new ones are still accepted.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// down cuts every connection and refuses new ones until up.
func (p *proxy) down() {
	p.mu.Lock()
	p.refusing = true
	p.mu.Unlock()
	p.cut()
}

// up accepts connections again.
func (p *proxy) up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refusing = false
}

// connections counts the connections accepted so far.
func (p *proxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// daemon is a consistd of the test's own ($CONSISTD_BIN), on a socket and store that survive restarts.
type daemon struct {
	t      *testing.T
	dir    string
	Socket string
	// Admin is its admin socket (/metrics).
	Admin string
	cmd   *exec.Cmd
	// exited receives the running process's exit (Wait's result).
	exited <-chan error
	log    *os.File
	// kubeconfig is the apiserver it talks to; CONSISTD_TEST_KUBECONFIG's when empty.
	kubeconfig string
}

// startDaemon starts a daemon with the given identity (and further lines of YAML configuration) and
// waits until it is ready; it is stopped when the test ends, and its log printed if the test failed.
func startDaemon(t *testing.T, identity string, config ...string) *daemon {
	return startDaemonWith(t, "", identity, config...)
}

// startDaemonWith is startDaemon reaching the apiserver through kubeconfig (CONSISTD_TEST_KUBECONFIG's
// when empty), e.g. a proxy's.
func startDaemonWith(t *testing.T, kubeconfig, identity string, config ...string) *daemon {
	dir := t.TempDir()
	d := &daemon{t: t, dir: dir, Socket: filepath.Join(dir, "consistd.sock"), Admin: filepath.Join(dir, "admin.sock"), kubeconfig: kubeconfig}
	if err := os.WriteFile(filepath.Join(dir, "consistd.yaml"), []byte("identity: "+identity+"\n"+strings.Join(config, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "consistd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d.log = log
	t.Cleanup(func() {
		d.stop()
		if t.Failed() {
			if b, err := os.ReadFile(log.Name()); err == nil {
				t.Logf("log of the test's daemon:\n%s", b)
			}
		}
		log.Close()
	})
	d.start()
	return d
}

// start runs the daemon and waits until `consistd status` answers.
func (d *daemon) start() {
	d.t.Helper()
	bin, kubeconfig := env(d.t, "CONSISTD_BIN"), d.kubeconfig
	if kubeconfig == "" {
		kubeconfig = env(d.t, "CONSISTD_TEST_KUBECONFIG")
	}
	admin := d.Admin
	cmd := exec.Command(bin, "run", "--config", filepath.Join(d.dir, "consistd.yaml"), "--socket", d.Socket,
		"--admin-socket", admin, "--store-dir", filepath.Join(d.dir, "store"))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	exited := make(chan error, 1)
	d.cmd, d.exited = cmd, exited
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := exec.CommandContext(ctx, bin, "status", "--admin-socket", admin).Run()
		cancel()
		if err == nil {
			return
		}
		select {
		case err := <-exited:
			d.t.Fatalf("the test's daemon exited while starting: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	d.t.Fatalf("the test's daemon was not ready within %s", waitFor)
}

// stop sends SIGTERM and waits for the daemon to exit (SIGKILL after 20 s).
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	cmd := d.cmd
	d.cmd = nil
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-d.exited
	}
}

// pause stops the daemon's process (SIGSTOP): its sockets stay open but nothing is answered. A signal is
// delivered asynchronously, so pause returns once the kernel shows every thread of the process stopped.
func (d *daemon) pause() {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		d.t.Fatalf("pausing the test's daemon: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for d.state() != "stopped" {
		if time.Now().After(deadline) {
			d.t.Fatalf("the test's daemon was not stopped 5 s after SIGSTOP: %s", d.state())
		}
		time.Sleep(time.Millisecond)
	}
}

// state is "stopped" when every thread of the daemon's process is stopped, else what /proc shows of them
// (for a failure's message: a paused daemon that answered was running again).
func (d *daemon) state() string {
	dir := fmt.Sprintf("/proc/%d/task", d.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("reading %s: %v", dir, err)
	}
	var running []string
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// The field after the command name, which is in parentheses and may hold spaces.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 0 && fields[0] != "T" {
			running = append(running, task.Name()+":"+fields[0])
		}
	}
	if len(running) == 0 {
		return "stopped"
	}
	return "threads not stopped (tid:state): " + strings.Join(running, " ")
}

// resume lets a paused daemon run again (SIGCONT); it does nothing once the daemon was stopped or killed.
func (d *daemon) resume() {
	d.t.Helper()
	if d.cmd == nil {
		return
	}
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		d.t.Errorf("resuming the test's daemon: %v", err)
	}
}

// kill ends the daemon at once (SIGKILL), as a crash would, and waits for it to exit.
func (d *daemon) kill() {
	d.t.Helper()
	cmd := d.cmd
	d.cmd = nil
	if err := cmd.Process.Kill(); err != nil {
		d.t.Fatalf("killing the test's daemon: %v", err)
	}
	<-d.exited
}
