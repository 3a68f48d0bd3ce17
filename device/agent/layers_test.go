package agent

import (
	"encoding/json"
	"testing"
)

// BenchmarkLayers runs echoMessage and json.Unmarshal, which it stands in
// for, on an echo's arguments: the difference is what it saves.
func BenchmarkLayers(b *testing.B) {
	args := []byte(`{"message":"ping"}`)
	b.Run("echo/layer=hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := echoMessage(args); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("echo/layer=general", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in struct {
				Message string `json:"message"`
			}
			if err := json.Unmarshal(args, &in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
