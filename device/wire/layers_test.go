package wire

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// BenchmarkLayers runs each one-pass reader and writer of this package
// and the general path it stands in for on the frames of one call (the
// cmd the tier writes and the device reads, the cmd_ack the device writes
// and the tier reads): the difference is what the hand layer saves.
func BenchmarkLayers(b *testing.B) {
	set, err := schemas.Load()
	if err != nil {
		b.Fatal(err)
	}
	cmdFrame, ackFrame := []byte(fastSeeds[0]), []byte(fastSeeds[1])
	for _, f := range []struct {
		name  string
		frame []byte
	}{{"cmd", cmdFrame}, {"cmd_ack", ackFrame}} {
		b.Run("envelope="+f.name+"/layer=hand", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := fastEnvelope(f.frame); !ok {
					b.Fatal("declined")
				}
			}
		})
		b.Run("envelope="+f.name+"/layer=general", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := set.ValidateJSON(schemas.Envelope, f.frame); err != nil {
					b.Fatal(err)
				}
				var e Envelope
				if err := json.Unmarshal(f.frame, &e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	cmd, _ := fastEnvelope(cmdFrame)
	ack, _ := fastEnvelope(ackFrame)
	b.Run("payload=cmd/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c Cmd
			if !fastCmd(cmd.Payload, &c) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("payload=cmd/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var c Cmd
			if err := strictUnmarshal(cmd.Payload, &c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("payload=cmd_ack/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a CmdAck
			if !fastCmdAck(ack.Payload, &a) {
				b.Fatal("declined")
			}
		}
	})
	b.Run("payload=cmd_ack/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a CmdAck
			if err := strictUnmarshal(ack.Payload, &a); err != nil {
				b.Fatal(err)
			}
		}
	})
	var c Cmd
	var a CmdAck
	fastCmd(cmd.Payload, &c)
	fastCmdAck(ack.Payload, &a)
	for _, p := range []struct {
		name    string
		payload any
	}{{"cmd", c}, {"cmd_ack", a}} {
		b.Run("encode="+p.name+"/layer=hand", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := EncodeID(TypeCmd, "01HZXC0000000000000000SRV0", "01HZXC0000000000000000DEV0", p.payload); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("encode="+p.name+"/layer=general", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				raw, err := json.Marshal(p.payload)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := json.Marshal(Envelope{Type: TypeCmd, MsgID: "01HZXC0000000000000000SRV0",
					InReplyTo: "01HZXC0000000000000000DEV0", Payload: raw}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
