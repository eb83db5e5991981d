// Package consistd is the Go client for the consistd sidecar: connect to its Unix socket, wait until it
// is ready, then watch objects, write them (optionally fenced by a leadership term), lead elections, send
// messages to peers and await their outcomes, handle the messages peers send, and run a reconciler on the
// sidecar's work queue (Reconcile).
//
//	client, err := consistd.New() // $CONSISTD_SOCKET, else /var/run/consistd/consistd.sock
//	if err != nil { ... }
//	defer client.Close()
//	if err := client.WaitReady(ctx, 30*time.Second); err != nil { ... }
//	for ev, err := range client.Watch(ctx, consistd.WatchRequest{Resource: "configmaps", Namespace: "default"}) {
//		if err != nil { ... } // the daemon refused the watch; lost connections are resumed on their own
//		fmt.Println(ev.Type, ev.Object) // ADDED default/settings; SYNCED and RESYNC_REQUIRED have no object
//	}
//
// Errors from the daemon are gRPC status errors, returned unchanged: status.Code(err) and
// status.Convert(err).Message() give the code and message it sent (INVALID_ARGUMENT names the field).
//
// The generated protocol (every message and service client) is in package
// github.com/consistd/consistd/client-sdk/go/gen/consistd/v1; Client.Conn gives the connection for the
// services this package does not wrap (RolloutService).
package consistd

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

// DefaultSocket is where the sidecar listens unless CONSISTD_SOCKET (or WithSocket) says otherwise.
const DefaultSocket = "/var/run/consistd/consistd.sock"

// readyPoll is how often WaitReady asks the health service again.
const readyPoll = 50 * time.Millisecond

// Client is a connection to one consistd sidecar. It connects lazily, reconnects on demand and is safe
// for concurrent use; Close it when done.
type Client struct {
	socket string
	conn   *grpc.ClientConn
	// sends and acked are the SendStream and AckStream calls every Send and ACK of this client share.
	sends *ordered[pb.SendStreamRequest, pb.SendStreamResponse]
	acked *ordered[pb.AckStreamRequest, pb.AckStreamResponse]
	// writes is what this client's object writes returned, for the own-write rule of its watches.
	writes *ownWrites
	// log receives what the SDK cannot return to a caller (WithLogger); nil means slog.Default().
	log *slog.Logger

	watch      pb.WatchServiceClient
	objects    pb.ObjectsServiceClient
	leadership pb.LeadershipServiceClient
	outbox     pb.OutboxServiceClient
	inbox      pb.InboxServiceClient
	reconcile  pb.ReconcileServiceClient
}

// Option configures New.
type Option func(*options)

type options struct {
	socket      string
	dialOptions []grpc.DialOption
	logger      *slog.Logger
}

// WithSocket connects to the sidecar's socket at path instead of CONSISTD_SOCKET or DefaultSocket.
func WithSocket(path string) Option {
	return func(o *options) { o.socket = path }
}

// WithDialOptions adds gRPC dial options (interceptors, message sizes, ...) to the connection.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOptions = append(o.dialOptions, opts...) }
}

// WithLogger sets where the client logs what it cannot return to a caller: a Reconcile's lost connections,
// refused completions, leases that ran out and recovered panics. slog.Default() otherwise.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// New returns a client for the socket named by CONSISTD_SOCKET, else DefaultSocket, unless WithSocket
// names another. Nothing is connected until the first call; use WaitReady to wait for the sidecar.
func New(opts ...Option) (*Client, error) {
	o := options{socket: os.Getenv("CONSISTD_SOCKET")}
	if o.socket == "" {
		o.socket = DefaultSocket
	}
	for _, opt := range opts {
		opt(&o)
	}
	socket := o.socket
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Every connection goes to the socket; the target below only names the authority.
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		}),
		// A local socket is cheap to retry: reconnect within a second of the sidecar coming back
		// (gRPC's default backoff grows to two minutes).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// Answers of any size: a List (or a Get, or a watch event) of big objects passes gRPC's default
		// 4 MiB receive limit, and the sidecar is the app's own, trusted, over a local socket.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32)),
	}
	conn, err := grpc.NewClient("passthrough:///consistd", append(dial, o.dialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("consistd: client for %s: %w", socket, err)
	}
	outbox, inbox := pb.NewOutboxServiceClient(conn), pb.NewInboxServiceClient(conn)
	return &Client{
		socket: socket,
		conn:   conn,
		writes: newOwnWrites(),
		log:    o.logger,
		sends: newOrdered("send", func(ctx context.Context) (grpc.BidiStreamingClient[pb.SendStreamRequest, pb.SendStreamResponse], error) {
			return outbox.SendStream(ctx)
		}),
		acked: newOrdered("ack", func(ctx context.Context) (grpc.BidiStreamingClient[pb.AckStreamRequest, pb.AckStreamResponse], error) {
			return inbox.AckStream(ctx)
		}),
		watch:      pb.NewWatchServiceClient(conn),
		objects:    pb.NewObjectsServiceClient(conn),
		leadership: pb.NewLeadershipServiceClient(conn),
		outbox:     outbox,
		inbox:      inbox,
		reconcile:  pb.NewReconcileServiceClient(conn),
	}, nil
}

// logger is where the client logs (WithLogger), slog.Default() unless set.
func (c *Client) logger() *slog.Logger {
	if c.log != nil {
		return c.log
	}
	return slog.Default()
}

// Socket is the path of the sidecar's socket this client talks to.
func (c *Client) Socket() string { return c.socket }

// Conn is the underlying gRPC connection, for the generated service clients this package does not wrap.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection; streams, pending Send and ACK calls and pending Sent.Wait calls end with
// an error (CANCELED; a Wait pausing before it reconnects, once its pause is over).
func (c *Client) Close() error {
	c.sends.close()
	c.acked.close()
	return c.conn.Close()
}

// NotReadyError is WaitReady's answer when the sidecar did not report SERVING in time.
type NotReadyError struct {
	// Socket is the sidecar's socket.
	Socket string
	// Timeout is how long WaitReady waited.
	Timeout time.Duration
	// Last is the last answer seen: a health status, or the error of the last health check.
	Last string
	// Err is the last health check's error, if it failed (a gRPC status error).
	Err error
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("consistd at %s not ready within %s: %s", e.Socket, e.Timeout, e.Last)
}

// Unwrap gives the last health check's error.
func (e *NotReadyError) Unwrap() error { return e.Err }

// WaitReady polls the sidecar's standard gRPC health service until it reports SERVING, retrying while
// the socket is missing or the daemon is starting. After timeout (or when ctx ends) it returns a
// *NotReadyError naming the socket and the last answer seen.
func (c *Client) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	health := healthpb.NewHealthClient(c.conn)
	last, lastErr := "no answer yet", error(nil)
	for {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		switch {
		case err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING:
			return nil
		case err == nil:
			last, lastErr = "health is "+r.GetStatus().String(), nil
		case ctx.Err() == nil:
			// A call cut short by the deadline says nothing new about the sidecar.
			last, lastErr = err.Error(), err
		}
		select {
		case <-ctx.Done():
			return &NotReadyError{Socket: c.socket, Timeout: timeout, Last: last, Err: lastErr}
		case <-time.After(readyPoll):
		}
	}
}
