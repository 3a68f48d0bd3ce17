package roles

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/schemas"
)

// loadNodeLabels reads the tier's --node-labels file: the operator's
// names and labels of nodes, by node id, which win over the devices' own.
// YAML, or JSON (which is YAML):
//
//	nodes:
//	  01hzx9k3m4p7q8r9s0t1v2w3xy:
//	    name: kitchen-pi
//	    labels: {site: paris, example.com/rack: r12}
//
// A key it does not know, a node id written twice, or a name or label
// that breaks its rule is an error naming the file and line: a typo must
// not go unnoticed as a label that silently never applies. "" reads
// nothing.
func loadNodeLabels(path string) (map[string]tier.NodeSettings, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--node-labels: %w", err)
	}
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(b)).Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // an empty file: no settings
		}
		return nil, fmt.Errorf("--node-labels %s: not YAML: %w", path, err)
	}
	at := func(n *yaml.Node, format string, a ...any) error {
		return fmt.Errorf("--node-labels %s:%d: %s", path, n.Line, fmt.Sprintf(format, a...))
	}
	if len(doc.Content) == 0 {
		return nil, nil // comments alone: no settings
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, at(root, "want a mapping with the key nodes")
	}
	nodes := map[string]tier.NodeSettings{}
	for i := 0; i < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "nodes" {
			return nil, at(k, "unknown key %q (want nodes)", k.Value)
		}
		if v.Kind != yaml.MappingNode {
			return nil, at(v, "nodes: want a mapping of node ids")
		}
		for j := 0; j < len(v.Content); j += 2 {
			id, entry := v.Content[j], v.Content[j+1]
			if !schemas.ValidNodeID(id.Value) {
				return nil, at(id, "%q is not a node id (a lower-case ULID)", id.Value)
			}
			if _, dup := nodes[id.Value]; dup {
				return nil, at(id, "node %s is written twice", id.Value)
			}
			s, err := nodeSettings(entry, at)
			if err != nil {
				return nil, err
			}
			nodes[id.Value] = s
		}
	}
	return nodes, nil
}

// nodeSettings reads one node's entry: name and labels, both optional.
func nodeSettings(entry *yaml.Node, at func(*yaml.Node, string, ...any) error) (tier.NodeSettings, error) {
	var s tier.NodeSettings
	if entry.Kind != yaml.MappingNode {
		return s, at(entry, "want a mapping with name and labels")
	}
	for i := 0; i < len(entry.Content); i += 2 {
		k, v := entry.Content[i], entry.Content[i+1]
		switch k.Value {
		case "name":
			if v.Kind != yaml.ScalarNode || !schemas.ValidNodeName(v.Value) {
				return s, at(v, "name: want ^[a-z0-9][a-z0-9.-]{0,62}$")
			}
			s.Name = v.Value
		case "labels":
			if v.Kind != yaml.MappingNode {
				return s, at(v, "labels: want a mapping of key: value")
			}
			s.Labels = make(map[string]string, len(v.Content)/2)
			for j := 0; j < len(v.Content); j += 2 {
				lk, lv := v.Content[j], v.Content[j+1]
				if lk.Kind != yaml.ScalarNode || lv.Kind != yaml.ScalarNode {
					return s, at(lk, "labels: want key: value, both plain")
				}
				if _, dup := s.Labels[lk.Value]; dup {
					return s, at(lk, "label %q is written twice", lk.Value)
				}
				val := lv.Value
				if lv.Tag == "!!null" {
					val = "" // "key:" with nothing after it
				}
				if err := schemas.CheckLabelKey(lk.Value); err != nil {
					return s, at(lk, "label %q: %v", lk.Value, err)
				}
				if err := schemas.CheckLabelValue(val); err != nil {
					return s, at(lv, "label %q: %v", lk.Value, err)
				}
				s.Labels[lk.Value] = val
			}
			if len(s.Labels) > schemas.MaxLabels {
				return s, at(v, "more than %d labels", schemas.MaxLabels)
			}
		default:
			return s, at(k, "unknown key %q (want name or labels)", k.Value)
		}
	}
	return s, nil
}

// parseLabels reads repeated --label k=v flags: nil for none.
func parseLabels(flags []string) (map[string]string, error) {
	var labels map[string]string
	for _, f := range flags {
		k, v, err := schemas.ParseLabel(f)
		if err != nil {
			return nil, fmt.Errorf("--label: %w", err)
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("--label: key %q given twice", k)
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[k] = v
	}
	if len(labels) > schemas.MaxLabels {
		return nil, fmt.Errorf("--label: more than %d labels", schemas.MaxLabels)
	}
	return labels, nil
}
