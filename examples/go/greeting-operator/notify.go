// The operator's ACK-tracked notification to its peer app about a published Greeting.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	consistd "github.com/consistd/consistd/client-sdk/go"
)

// notify tells peer that the ConfigMap cm now holds message, and waits for its receiver's ACK. The
// notification is about the Greeting (resource greetings/<ns>/<name>), versioned by the ConfigMap's
// resourceVersion.
func notify(ctx context.Context, client *consistd.Client, peer string, cm *consistd.Object, message string) error {
	payload, err := json.Marshal(struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		Message   string `json:"message"`
	}{cm.Namespace, cm.Name, message})
	if err != nil {
		return fmt.Errorf("encoding the notification about greeting %s: %w", cm, err)
	}
	sent, err := client.Send(ctx, consistd.SendRequest{
		To:          destination(peer),
		ResourceID:  "greetings/" + cm.Namespace + "/" + cm.Name,
		EventID:     cm.ResourceVersion,
		Payload:     payload,
		ContentType: "application/json",
	})
	if err != nil {
		return fmt.Errorf("notifying %s about greeting %s: %w", peer, cm, err)
	}
	outcome, err := sent.Wait(ctx)
	if err != nil {
		return fmt.Errorf("waiting for %s to ACK %s: %w", peer, sent.MessageID, err)
	}
	fmt.Printf("notified %s %s %s\n", peer, outcome.Kind, sent.MessageID)
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
