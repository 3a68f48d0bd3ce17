package device_test

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/device"
)

var ackFrame = []byte(`{"type":"cmd_ack","msg_id":"01HZXC0000000000000000DEV0","in_reply_to":"01HZXC0000000000000000SRV0",` +
	`"payload":{"ok":true,"result":{"message":"ping","received_at_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy"}}}`)

// BenchmarkDecodeEnvelope: one cmd_ack frame, as the tier reads it.
func BenchmarkDecodeEnvelope(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		e, err := device.DecodeEnvelope(ackFrame)
		if err != nil {
			b.Fatal(err)
		}
		var ack device.CmdAck
		if err := device.DecodePayload(e, &ack); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeCmd: one cmd frame, as the tier writes it.
func BenchmarkEncodeCmd(b *testing.B) {
	b.ReportAllocs()
	cmd := device.Cmd{Tool: "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke",
		Arguments: json.RawMessage(`{"message":"ping"}`), DeadlineMs: 2000, RequestID: "01HZXC0000000000000000REQ0"}
	for b.Loop() {
		if _, err := device.EncodeID(device.TypeCmd, "01HZXC0000000000000000SRV0", "", cmd); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeviceRoundTrip: one unary call at a time through the device
// hop, from a NATS request to its reply: the tier's subscription, the
// WebSocket to a mock device (another goroutine of this process) and back.
// It is the part of a call's latency okso adds on top of an MCP server.
func BenchmarkDeviceRoundTrip(b *testing.B) {
	tt := newTestTier(b, device.TierOptions{})
	o := device.MockOptions(device.NewNodeID(), tt.set, 1)
	for i := range o.Capabilities {
		o.Capabilities[i].Constraints.RateLimitRPS = 1e5 // the echo's own 10/s would be the figure
	}
	rd := tt.runDevice(b, o)
	name := echoTool(rd.node)
	b.ReportAllocs()
	for b.Loop() {
		if r := tt.call(b.Context(), rd.node, tenant, name, `{"message":"ping"}`); r.err != nil || !r.reply.OK {
			b.Fatalf("call: %v", r)
		}
	}
}
