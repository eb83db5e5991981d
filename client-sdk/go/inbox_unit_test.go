// Unit tests of the inbox against a fake AckStream: what a handler is given of a delivered message.

package consistd

import (
	"context"
	"testing"

	pb "github.com/consistd/consistd/client-sdk/go/gen/consistd/v1"
)

func TestAHandlerSeesTheGuardTheMessageWasSentUnderAndNoneForAnUnguardedSend(t *testing.T) {
	acked := make(chan string, 1)
	c := &Client{acked: newOrdered("ack", answering(func(r *pb.AckStreamRequest) *pb.AckStreamResponse {
		acked <- r.GetMessageId()
		return &pb.AckStreamResponse{}
	}))}
	defer c.acked.close()
	for _, tc := range []struct {
		guard *pb.WriteGuard
		want  *Guard
	}{
		{&pb.WriteGuard{Election: "lead", Namespace: "ns", Term: 3}, &Guard{Election: "lead", Namespace: "ns", Term: 3}},
		{nil, nil},
	} {
		var got *Guard
		err := c.Inbox().handle(context.Background(), func(_ context.Context, m *Message) error {
			got = m.Guard
			return nil
		}, &pb.InboxMessage{MessageId: "7", Sender: "a", ResourceId: "r", EventId: "1", Guard: tc.guard})
		if err != nil {
			t.Fatalf("handle: %v", err)
		}
		if id := <-acked; id != "7" {
			t.Fatalf("ACKed message %q, want 7", id)
		}
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("message sent under %v: the handler saw guard %+v, want %+v", tc.guard, got, tc.want)
		}
	}
}
