package mcp

import (
	"encoding/json"
	"testing"
)

// BenchmarkLayers runs the gateway's one-pass readers and the general
// path each stands in for on the documents of one call (the request as
// okso bench and as the Go SDK's client send it, the device's result):
// the difference is what the hand layer saves.
func BenchmarkLayers(b *testing.B) {
	for _, r := range []struct{ name, body string }{{"bench", benchCall}, {"sdk", sdkCall}} {
		body := []byte(r.body)
		var memo metaMemo
		b.Run("request="+r.name+"/layer=hand", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := parseCanonicalRequest(body, &memo); !ok {
					b.Fatal("declined")
				}
			}
		})
		b.Run("request="+r.name+"/layer=general", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := parseStrictRequest(body); !ok {
					b.Fatal("declined")
				}
			}
		})
	}
	result := []byte(`{"message":"bench","received_at_ms":1795316088218,"node_id":"01m80hetn3a3x84z368v26yy0p"}`)
	b.Run("node_id/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := resultNodeID(result); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("node_id/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var who struct {
				NodeID string `json:"node_id"`
			}
			if err := json.Unmarshal(result, &who); err != nil {
				b.Fatal(err)
			}
		}
	})
}
