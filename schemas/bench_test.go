package schemas_test

import (
	"testing"

	"github.com/okso-io/okso/schemas"
)

// BenchmarkValidateEchoInput and ...Output: the checks on both legs of a
// call (decode with the duplicate-key check, then the compiled schema).
func BenchmarkValidateEchoInput(b *testing.B) {
	set, err := schemas.Load()
	if err != nil {
		b.Fatal(err)
	}
	doc := []byte(`{"message":"ping"}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := set.ValidateJSON(schemas.EchoInput, doc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateEchoOutput(b *testing.B) {
	set, err := schemas.Load()
	if err != nil {
		b.Fatal(err)
	}
	doc := []byte(`{"message":"ping","received_at_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy"}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := set.ValidateJSON(schemas.EchoOutput, doc); err != nil {
			b.Fatal(err)
		}
	}
}
