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

// Project returns the tools a node's capabilities project with the
// built-in kinds alone; [KindTable.Project] knows registered ones too.
func Project(nodeID string, caps []Capability) ([]Tool, error) {
	return (*KindTable)(nil).Project(nodeID, caps)
}

// Project returns the tools a node's capabilities project, a tool per verb
// of each capability, in manifest order. It checks what the manifest
// schema cannot: a kind the table does not have (the manifest's kind is
// only a pattern: the table is the closed set), a cap_id used twice, a
// verb its kind does not have, for a registered kind a schema_ref that is
// not one of its verbs' input schemas (its major picks the kind's
// version) and a safety class its clamp refuses, and a projected name
// that is not a valid tool name (too long, say). The tier refuses a
// manifest Project refuses; the gateway, reading what a tier wrote, lists
// none of such a node's tools. caps is not modified.
func (t *KindTable) Project(nodeID string, caps []Capability) ([]Tool, error) {
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
		k, ok := t.lookupRef(c.Kind, c.SchemaRef)
		if !ok {
			if _, known := t.Lookup(c.Kind); known {
				return nil, errors.New("version of its kind not registered")
			}
			return nil, errors.New("unknown kind")
		}
		if k.Registered() {
			if _, ok := k.VerbByInput(c.SchemaRef); !ok {
				return nil, errors.New("schema_ref is not an input schema of its kind")
			}
			if k.Safety != "" && c.SafetyClass != k.Safety {
				return nil, errors.New("safety_class is not its kind's")
			}
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
