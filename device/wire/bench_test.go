package wire_test

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/device/wire"
)

var ackFrame = []byte(`{"type":"cmd_ack","msg_id":"01HZXC0000000000000000DEV0","in_reply_to":"01HZXC0000000000000000SRV0",` +
	`"payload":{"ok":true,"result":{"message":"ping","received_at_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy"}}}`)

// BenchmarkDecodeEnvelope: one cmd_ack frame, as the tier reads it.
func BenchmarkDecodeEnvelope(b *testing.B) {
	set := loadSchemas(b)
	b.ReportAllocs()
	for b.Loop() {
		e, err := wire.DecodeEnvelope(set, ackFrame)
		if err != nil {
			b.Fatal(err)
		}
		var ack wire.CmdAck
		if err := wire.DecodePayload(e, &ack); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeCmd: one cmd frame, as the tier writes it.
func BenchmarkEncodeCmd(b *testing.B) {
	b.ReportAllocs()
	cmd := wire.Cmd{Tool: "sysecho.01hzx9k3m4p7q8r9s0t1v2w3xy.echo.invoke",
		Arguments: json.RawMessage(`{"message":"ping"}`), DeadlineMs: 2000, RequestID: "01HZXC0000000000000000REQ0"}
	for b.Loop() {
		if _, err := wire.EncodeID(wire.TypeCmd, "01HZXC0000000000000000SRV0", "", cmd); err != nil {
			b.Fatal(err)
		}
	}
}
