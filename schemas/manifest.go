package schemas

import (
	"errors"
	"fmt"
)

// Agent names the software a node runs.
type Agent struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// Capability is one entry of a node's manifest (seed 000 §9 shape).
type Capability struct {
	CapID       string      `json:"cap_id"`
	Kind        string      `json:"kind"`
	SchemaRef   string      `json:"schema_ref"`
	Verbs       []string    `json:"verbs"`
	SafetyClass string      `json:"safety_class"`
	Idempotent  bool        `json:"idempotent,omitempty"`
	Constraints Constraints `json:"constraints,omitzero"`
	// Description is a local tool's (kind local.tool), in its operator's
	// words; no other kind has one.
	Description string `json:"description,omitempty"`
}

// Constraints limit how a capability may be called.
type Constraints struct {
	RateLimitRPS      float64 `json:"rate_limit_rps,omitempty"`
	MaxConcurrency    int     `json:"max_concurrency,omitempty"`
	DeadlineMsDefault int     `json:"deadline_ms_default,omitempty"`
}

// MaxCapabilities is the most capabilities a manifest may announce: the
// manifest schema's maxItems (TestMaxCapabilities holds the two equal).
const MaxCapabilities = 64

// Tool is one tool a manifest projects: a verb of one of its capabilities.
type Tool struct {
	Name  string      // {kind_short}.{node_id}.{cap_id}.{verb}
	Cap   *Capability // the capability, an element of the slice projected
	Kind  Kind        // the capability's kind, from the kind table
	Verb  Verb        // the verb, from the kind table
	Class string      // the verb's safety class
}

// Project returns the tools a node's capabilities project, a tool per verb
// of each capability, in manifest order. It checks what the manifest
// schema cannot: a cap_id used twice, a verb its kind does not have, and
// a projected name that is not a valid tool name (too long, say). The
// tier refuses a manifest Project refuses; the gateway, reading what a
// tier wrote, lists none of such a node's tools. caps is not modified.
func Project(nodeID string, caps []Capability) ([]Tool, error) {
	if !ValidNodeID(nodeID) {
		return nil, errors.New("node id is not a lower-case ULID")
	}
	var tools []Tool
	for i := range caps {
		c := &caps[i]
		for j := range i {
			if caps[j].CapID == c.CapID {
				return nil, errors.New("duplicate cap_id")
			}
		}
		k, ok := LookupKind(c.Kind)
		if !ok {
			return nil, errors.New("unknown kind")
		}
		for _, vn := range c.Verbs {
			v, ok := k.Verb(vn)
			if !ok {
				return nil, errors.New("verb not allowed for its kind")
			}
			name := ToolName{KindShort: k.Short, NodeID: nodeID, CapID: c.CapID, Verb: v.Name}.String()
			if len(name) > MaxToolName {
				return nil, fmt.Errorf("projected tool name longer than %d characters", MaxToolName)
			}
			if _, ok := ParseToolName(name); !ok {
				return nil, errors.New("projected tool name is not a valid tool name")
			}
			tools = append(tools, Tool{Name: name, Cap: c, Kind: k, Verb: v, Class: v.SafetyOf(c.SafetyClass)})
		}
	}
	return tools, nil
}
