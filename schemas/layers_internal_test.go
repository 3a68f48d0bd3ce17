package schemas

import "testing"

// BenchmarkQuickLayer runs the quick schemas and the general validator
// they stand in for on the documents of one echo call (its arguments,
// checked at the gateway decoded and at the device still in text, and its
// result, checked at the gateway in text): the difference is what the
// quick layer saves.
func BenchmarkQuickLayer(b *testing.B) {
	s, err := Load()
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range []struct {
		name, id string
		doc      []byte
	}{
		{"echo.input", EchoInput, []byte(`{"message":"ping"}`)},
		{"echo.output", EchoOutput, []byte(`{"message":"ping","received_at_ms":1745236800012,"node_id":"01hzx9k3m4p7q8r9s0t1v2w3xy"}`)},
	} {
		q := s.quick[d.id]
		if q == nil {
			b.Fatalf("%s has no quick form", d.id)
		}
		v, err := Decode(d.doc)
		if err != nil {
			b.Fatal(err)
		}
		general := func(v any) {
			if _, err := checkValue(v, false); err != nil {
				b.Fatal(err)
			}
			if err := s.compiled[d.id].Validate(v); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("doc="+d.name+"/form=text/layer=quick", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !q.acceptsJSON(d.doc) {
					b.Fatal("declined")
				}
			}
		})
		b.Run("doc="+d.name+"/form=text/layer=general", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				v, err := Decode(d.doc)
				if err != nil {
					b.Fatal(err)
				}
				general(v)
			}
		})
		b.Run("doc="+d.name+"/form=decoded/layer=quick", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !q.accepts(v) {
					b.Fatal("declined")
				}
			}
		})
		b.Run("doc="+d.name+"/form=decoded/layer=general", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				general(v)
			}
		})
	}
}
