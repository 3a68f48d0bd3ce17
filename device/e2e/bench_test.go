package e2e_test

import (
	"testing"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// BenchmarkDeviceRoundTrip: one unary call at a time through the device
// hop, from a NATS request to its reply: the tier's subscription, the
// WebSocket to a mock device (another goroutine of this process) and back.
// It is the part of a call's latency okso adds on top of an MCP server.
func BenchmarkDeviceRoundTrip(b *testing.B) {
	tt := newTestTier(b, tier.Options{})
	o := agent.MockOptions(wire.NewNodeID(), tt.Schemas, 1)
	for i := range o.Capabilities {
		o.Capabilities[i].Constraints.RateLimitRPS = 1e5 // the echo's own 10/s would be the figure
	}
	rd := tt.runDevice(b, o)
	name := tiertest.EchoTool(rd.node)
	b.ReportAllocs()
	for b.Loop() {
		if r := tt.Call(b.Context(), rd.node, tiertest.Tenant, name, `{"message":"ping"}`); r.Err != nil || !r.Reply.OK {
			b.Fatalf("call: %v", r)
		}
	}
}
