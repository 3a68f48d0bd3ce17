package tier

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// NodeSettings are what the tier's operator says of one node: its name
// and labels, which win over the device's own (Options.Nodes).
type NodeSettings struct {
	Name   string            // "": the device's
	Labels map[string]string // merged over the device's and the token's, key by key
}

// checkNodes checks the operator's settings by the rules a device's
// announce is held to, so that what reaches the registry obeys them
// whoever said it.
func checkNodes(nodes map[string]NodeSettings) error {
	for id, n := range nodes {
		if !schemas.ValidNodeID(id) {
			return fmt.Errorf("node %q: not a node id (a lower-case ULID)", id)
		}
		if n.Name != "" && !schemas.ValidNodeName(n.Name) {
			return fmt.Errorf("node %s: name %q is not ^[a-z0-9][a-z0-9.-]{0,62}$", id, n.Name)
		}
		if err := schemas.CheckLabels(n.Labels); err != nil {
			return fmt.Errorf("node %s: %w", id, err)
		}
	}
	return nil
}

// settle returns the name and labels a node is registered with: the
// device's, then its token's labels, then the tier's settings, each
// winning over the ones before key by key (the name: the settings' over
// the device's). All have been checked by their rules.
func (s *session) settle(a *wire.Announce) (name string, labels map[string]string) {
	n := s.t.o.Nodes[s.nodeID]
	name = a.Name
	if n.Name != "" {
		name = n.Name
	}
	return name, schemas.MergeLabels(a.Labels, s.tokenLabels, n.Labels)
}

// checkAnnounceLabels checks an announce's name and labels beyond the
// manifest schema (a label key's prefix length, which a pattern cannot
// say); "" when they pass.
func checkAnnounceLabels(a *wire.Announce) string {
	if err := schemas.CheckLabels(a.Labels); err != nil {
		return "announce " + err.Error()
	}
	return ""
}

// labelsRefusal explains why the manifest schema refused an announce
// when its name or labels are why, naming the rule and never the
// device's text; "" when they are not (or the payload does not decode):
// the schema's refusal then stands on its own.
func labelsRefusal(payload []byte) string {
	var a struct {
		Features []string       `json:"features"`
		Name     *string        `json:"name"`
		Labels   map[string]any `json:"labels"`
	}
	if json.Unmarshal(payload, &a) != nil || (a.Name == nil && a.Labels == nil) {
		return ""
	}
	if !slices.Contains(a.Features, wire.FeatureLabels) {
		return "announce has name or labels without the feature labels"
	}
	if a.Name != nil && !schemas.ValidNodeName(*a.Name) {
		return "announce name is not ^[a-z0-9][a-z0-9.-]{0,62}$"
	}
	labels := make(map[string]string, len(a.Labels))
	for k, v := range a.Labels {
		s, ok := v.(string)
		if !ok {
			return "announce label value is not a string"
		}
		labels[k] = s
	}
	if err := schemas.CheckLabels(labels); err != nil {
		return "announce " + err.Error()
	}
	return ""
}
