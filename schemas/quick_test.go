package schemas

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// quickIDs are the schemas with a quick form, in a fixed order.
func quickIDs(s *Set) []string {
	var ids []string
	for id := range s.quick {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// golden returns the golden documents of a schema: kind is valid or
// invalid.
func golden(t testing.TB, kind, id string) [][]byte {
	files, err := filepath.Glob(filepath.Join("testdata", kind, strings.TrimPrefix(id, IDPrefix), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
	return docs
}

// FuzzQuick: a document a quick schema accepts is one the general
// validator accepts.
func FuzzQuick(f *testing.F) {
	s, err := Load()
	if err != nil {
		f.Fatal(err)
	}
	ids := quickIDs(s)
	for i, id := range ids {
		for _, kind := range []string{"valid", "invalid"} {
			for _, doc := range golden(f, kind, id) {
				f.Add(uint8(i), doc)
			}
		}
		f.Add(uint8(i), []byte(`{"message":"é","received_at_ms":1.7e12,"node_id":"01m80hetn3a3x84z368v26yy0p","cpu_pct":100.0000001}`))
		f.Add(uint8(i), []byte(`{"ts_ms":-1,"level":"high","pin":1.0,"interval_ms":0.5e3}`))
	}
	f.Fuzz(func(t *testing.T, i uint8, doc []byte) {
		id := ids[int(i)%len(ids)]
		v, err := Decode(doc)
		if err != nil || !s.quick[id].accepts(v) {
			return
		}
		if err := s.compiled[id].Validate(v); err != nil {
			t.Fatalf("%s: quick accepts %s, the validator refuses it: %v", id, doc, err)
		}
	})
}

// TestQuickCovers: every verb schema has a quick form, which accepts the
// golden valid documents (so calls take it) and declines the invalid ones.
func TestQuickCovers(t *testing.T) {
	s, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	for id := range s.compiled {
		if id == Manifest || id == Envelope || id == ErrorEnvelope {
			continue
		}
		q := s.quick[id]
		if q == nil {
			t.Errorf("%s: no quick form", id)
			continue
		}
		for _, doc := range golden(t, "valid", id) {
			if v, err := Decode(doc); err != nil || !q.accepts(v) {
				t.Errorf("%s: quick declines the valid %s", id, doc)
			}
		}
		for _, doc := range golden(t, "invalid", id) {
			if v, err := Decode(doc); err == nil && q.accepts(v) {
				t.Errorf("%s: quick accepts the invalid %s", id, doc)
			}
		}
	}
}
