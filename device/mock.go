package device

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// NewNodeID returns a fresh node id: a ULID in lower case.
func NewNodeID() string { return strings.ToLower(ulid.Make().String()) }

// EchoCapability is the system.echo capability exactly as seed 000 §9
// has every device announce it.
func EchoCapability() bus.Capability {
	return bus.Capability{
		CapID:       "echo",
		Kind:        schemas.KindEcho,
		SchemaRef:   schemas.EchoInput,
		Verbs:       []string{"invoke"},
		SafetyClass: schemas.SafetyReadOnly,
		Constraints: bus.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000},
	}
}

// EchoResult is the result of system.echo (seed 000 §4).
type EchoResult struct {
	Message      string `json:"message"`
	ReceivedAtMs int64  `json:"received_at_ms"`
	NodeID       string `json:"node_id"`
}

// Echo returns the system.echo handler of a node.
func Echo(nodeID string) Handler {
	return func(_ context.Context, args json.RawMessage) (any, error) {
		now := time.Now().UnixMilli()
		var in struct {
			Message string `json:"message"`
		}
		if err := json.Unmarshal(args, &in); err != nil {
			return nil, bus.NewError(bus.CodeManifestInvalid, "arguments do not decode")
		}
		return EchoResult{Message: in.Message, ReceivedAtMs: now, NodeID: nodeID}, nil
	}
}

// MockOptions returns the options of a simulated device with the echo
// capability and synthetic metrics (a walk fixed by seed and the node id);
// the caller adds URLs, Token and whatever else it needs.
func MockOptions(nodeID string, set *schemas.Set, seed uint64) Options {
	return withMetrics(Options{
		NodeID:       nodeID,
		Agent:        bus.Agent{Name: "okso-mock", Version: "1.0.0"},
		Capabilities: []bus.Capability{EchoCapability()},
		Handlers:     map[string]Handler{"echo.invoke": Echo(nodeID)},
		Schemas:      set,
	}, NewMockSampler(seed, nodeID))
}

// AgentOptions returns the options of a real device agent: echo, and the
// metrics of the host it runs on.
func AgentOptions(nodeID string, set *schemas.Set, version string) Options {
	return withMetrics(Options{
		NodeID:       nodeID,
		Agent:        bus.Agent{Name: "okso-agent", Version: version},
		Capabilities: []bus.Capability{EchoCapability()},
		Handlers:     map[string]Handler{"echo.invoke": Echo(nodeID)},
		Schemas:      set,
	}, &HostSampler{})
}

func withMetrics(o Options, s Sampler) Options {
	h, st := Metrics(o.NodeID, s)
	o.Capabilities = append(o.Capabilities, MetricsCapability())
	for k, v := range h {
		o.Handlers[k] = v
	}
	o.Streams = st
	return o
}
