package agent

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// EchoCapability is the system.echo capability exactly as seed 000 §9
// has every device announce it.
func EchoCapability() schemas.Capability {
	return schemas.Capability{
		CapID:       "echo",
		Kind:        schemas.KindEcho,
		SchemaRef:   schemas.EchoInput,
		Verbs:       []string{"invoke"},
		SafetyClass: schemas.SafetyReadOnly,
		Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000},
	}
}

// EchoResult is the result of system.echo (seed 000 §4).
type EchoResult struct {
	Message      string `json:"message"`
	ReceivedAtMs int64  `json:"received_at_ms"`
	NodeID       string `json:"node_id"`
}

// Echo returns the system.echo handler of a node. It returns at once,
// so a device answers its cmds on the connection's reading goroutine
// (see [quickHandler]).
func Echo(nodeID string) Handler {
	return func(_ context.Context, args json.RawMessage) (any, error) {
		now := time.Now().UnixMilli()
		msg, ok := echoMessage(args)
		if !ok {
			var in struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
			}
			msg = in.Message
		}
		return EchoResult{Message: msg, ReceivedAtMs: now, NodeID: nodeID}, nil
	}
}

// echoMessage reads the message of echo arguments that passed their
// schema (an object with exactly that member), in one pass when it is a
// plain string written once; otherwise it reports false and
// json.Unmarshal decides.
func echoMessage(args []byte) (msg string, ok bool) {
	_, ok = jsonscan.Fields(args, []string{"message"}, func(_ int, v []byte) (ok bool) {
		msg, ok = jsonscan.String(v)
		return ok
	})
	return msg, ok
}

// MockOptions returns the options of a simulated device with the echo
// capability, synthetic metrics and a simulated GPIO pin (a walk fixed by seed and the node id);
// the caller adds URLs, Token and whatever else it needs.
func MockOptions(nodeID string, set *schemas.Set, seed uint64) Options {
	o := withMetrics(Options{
		NodeID:       nodeID,
		Agent:        schemas.Agent{Name: "okso-mock", Version: "1.0.0"},
		Capabilities: []schemas.Capability{EchoCapability()},
		Handlers:     map[string]Handler{"echo.invoke": Echo(nodeID)},
		Schemas:      set,
	}, NewMockSampler(seed, nodeID))
	quickHandler(&o, "echo.invoke")
	o.Capabilities = append(o.Capabilities, GPIOCapability())
	maps.Copy(o.Handlers, GPIO(nodeID))
	return o
}

// HostOptions returns the options of a real device agent (okso agent):
// echo, and the metrics of the host it runs on, named for the host
// ([HostName]).
func HostOptions(nodeID string, set *schemas.Set, version string) Options {
	o := withMetrics(Options{
		NodeID:       nodeID,
		Name:         HostName(),
		Agent:        schemas.Agent{Name: "okso-agent", Version: version},
		Capabilities: []schemas.Capability{EchoCapability()},
		Handlers:     map[string]Handler{"echo.invoke": Echo(nodeID)},
		Schemas:      set,
	}, &HostSampler{})
	quickHandler(&o, "echo.invoke")
	return o
}

// quickHandler marks o's handler of key, one of this package's that
// returns at once without blocking (echo), as quick: a device answers
// its cmds on the connection's reading goroutine, without the hand-off
// to a worker and back that a handler which may block needs (a cancel
// must be read while it runs). The mark holds the handler's function
// identity: a handler the caller puts in its place is not quick.
func quickHandler(o *Options, key string) {
	if o.quick == nil {
		o.quick = map[string]uintptr{}
	}
	o.quick[key] = reflect.ValueOf(o.Handlers[key]).Pointer()
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

// GPIOCapability is a simulated GPIO pin: the mutating demo capability of
// mock devices (reading it is read-only, driving it mutates).
func GPIOCapability() schemas.Capability {
	return schemas.Capability{
		CapID:       "pin",
		Kind:        schemas.KindGPIO,
		SchemaRef:   schemas.GPIOWriteInput,
		Verbs:       []string{"read", "write"},
		SafetyClass: schemas.SafetyMutating,
		Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 1, DeadlineMsDefault: 2000},
	}
}

// GPIO returns the handlers of a simulated pin of a node: "pin.read" and
// "pin.write". The pin starts low.
func GPIO(nodeID string) map[string]Handler {
	var (
		mu    sync.Mutex
		level int
	)
	type result struct {
		NodeID   string `json:"node_id"`
		Pin      string `json:"pin"`
		Level    int    `json:"level"`
		Previous *int   `json:"previous,omitempty"`
		TsMs     int64  `json:"ts_ms"`
	}
	return map[string]Handler{
		"pin.read": func(context.Context, json.RawMessage) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			return result{NodeID: nodeID, Pin: "pin", Level: level, TsMs: time.Now().UnixMilli()}, nil
		},
		"pin.write": func(_ context.Context, args json.RawMessage) (any, error) {
			var in struct {
				Level float64 `json:"level"` // 1 and 1.0 alike, as the schema sees them
			}
			if err := json.Unmarshal(args, &in); err != nil {
				return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
			}
			mu.Lock()
			defer mu.Unlock()
			prev := level
			level = int(in.Level)
			return result{NodeID: nodeID, Pin: "pin", Level: level, Previous: &prev, TsMs: time.Now().UnixMilli()}, nil
		},
	}
}

// HostName is this host's name as a node name ([schemas.NodeNameOf]):
// "" when the host has none, or none that maps to one.
func HostName() string {
	h, err := os.Hostname()
	if err != nil {
		return ""
	}
	return schemas.NodeNameOf(h)
}
