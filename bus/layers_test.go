package bus_test

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/bus"
)

// BenchmarkLayers runs the one-pass codec of a call on NATS and
// encoding/json, which it stands in for, on the messages of one call: the
// difference is what the hand layer saves.
func BenchmarkLayers(b *testing.B) {
	call := []byte(`{"tool":"sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke","arguments":{"message":"ping"}}`)
	reply := []byte(`{"ok":true,"result":{"message":"ping","received_at_ms":1745236800012,"node_id":"01m80hetn3a3x84z368v26yy0p"}}`)
	c, _ := bus.DecodeCall(call)
	b.Run("call/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bus.DecodeCall(call); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("call/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c bus.Call
			if err := json.Unmarshal(call, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reply/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := bus.DecodeReply(reply); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reply/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r bus.Reply
			if err := json.Unmarshal(reply, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode=call/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.Encode(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode=call/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}
