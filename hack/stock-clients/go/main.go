// Proves stock grpc-go (grpc.NewClient with a unix: target, insecure credentials, default options) can call consistd.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

const deadline = 30 * time.Second

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: stock-client-go SOCKET_PATH")
		os.Exit(2)
	}
	target := "unix:" + os.Args[1]
	label := "grpc-go " + target
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: NewClient FAILED: %v\n", label, err)
		os.Exit(1)
	}
	defer conn.Close()

	ok := true
	for _, c := range []struct {
		name string
		call func(*grpc.ClientConn) (string, error)
	}{
		{"Health/Check", health},
		{"ObjectsService/List", listNamespaces},
		{"WatchService/Subscribe", subscribeUntilSynced},
	} {
		got, err := c.call(conn)
		if err != nil {
			if s, isStatus := status.FromError(err); isStatus {
				err = fmt.Errorf("%s: %s", s.Code(), s.Message())
			}
			fmt.Fprintf(os.Stderr, "%s: %s FAILED: %v\n", label, c.name, err)
			ok = false
			continue
		}
		fmt.Printf("%s: %s %s\n", label, c.name, got)
	}
	if !ok {
		os.Exit(1)
	}
}

func health(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	response, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		return "", err
	}
	if response.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return "", fmt.Errorf("status %s, want SERVING", response.GetStatus())
	}
	return response.GetStatus().String(), nil
}

func listNamespaces(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	response, err := pb.NewObjectsServiceClient(conn).List(ctx, &pb.ListRequest{Resource: "namespaces"})
	if err != nil {
		return "", err
	}
	if len(response.GetObjects()) == 0 {
		return "", errors.New("no namespaces listed")
	}
	names := make([]string, 0, len(response.GetObjects()))
	for _, o := range response.GetObjects() {
		names = append(names, o.GetName())
	}
	return fmt.Sprintf("%d items (%s)", len(names), strings.Join(names, ", ")), nil
}

func subscribeUntilSynced(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel() // cancelling the context cancels the stream
	stream, err := pb.NewWatchServiceClient(conn).Subscribe(ctx, &pb.SubscribeRequest{
		Resource: "namespaces",
		Mode:     pb.DeliveryMode_DELIVERY_MODE_RAW,
	})
	if err != nil {
		return "", err
	}
	before := 0
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("stream ended after %d events without SYNCED", before)
		}
		if err != nil {
			return "", err
		}
		if event.GetType() == pb.EventType_EVENT_TYPE_SYNCED {
			cancel()
			return fmt.Sprintf("SYNCED after %d events, then cancelled", before), nil
		}
		before++
	}
}
