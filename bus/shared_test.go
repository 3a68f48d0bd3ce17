package bus

import (
	"encoding/json"
	"reflect"
	"runtime"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// TestSharedCapabilities: two records with the same capabilities share
// one decoded array, equal to what json.Unmarshal makes; another text is
// an array of its own; an array no record holds is collected and its
// entry dropped.
func TestSharedCapabilities(t *testing.T) {
	caps := []schemas.Capability{
		{CapID: "echo", Kind: schemas.KindEcho, SchemaRef: schemas.EchoInput, Verbs: []string{"invoke"}, SafetyClass: schemas.SafetyReadOnly,
			Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 4, DeadlineMsDefault: 2000}},
		{CapID: "logs", Kind: schemas.KindLocal, SchemaRef: schemas.LocalRunInput, Verbs: []string{"run"}, SafetyClass: schemas.SafetyMutating,
			Description: "Tail a log."},
	}
	record := func(node string, caps []schemas.Capability) []byte {
		b, _ := json.Marshal(Node{NodeID: node, Tenant: "acme", Tier: "t1", Capabilities: caps, Labels: map[string]string{"a": "b"}})
		return b
	}
	a, err := decodeRecord(record("01hzx9k3m4p7q8r9s0t1v2w3xa", caps))
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeRecord(record("01hzx9k3m4p7q8r9s0t1v2w3xb", caps))
	if err != nil {
		t.Fatal(err)
	}
	var want Node
	if err := json.Unmarshal(record("01hzx9k3m4p7q8r9s0t1v2w3xa", caps), &want); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(a)
	jw, _ := json.Marshal(&want)
	if string(ja) != string(jw) {
		t.Errorf("decodeRecord = %s\njson.Unmarshal = %s", ja, jw)
	}
	if &a.Capabilities[0] != &b.Capabilities[0] {
		t.Error("two records of the same capabilities hold two arrays")
	}
	other := append([]schemas.Capability(nil), caps[0])
	c, err := decodeRecord(record("01hzx9k3m4p7q8r9s0t1v2w3xc", other))
	if err != nil || len(c.Capabilities) != 1 || &c.Capabilities[0] == &a.Capabilities[0] {
		t.Errorf("other capabilities: %+v, %v", c, err)
	}
	if _, err := decodeRecord([]byte(`{"node_id":"x","capabilities":{"no":"array"}}`)); err == nil {
		t.Error("capabilities that are no array decoded")
	}

	key := mustJSON(t, other)
	sharedCaps.Lock()
	_, held := sharedCaps.m[string(key)]
	sharedCaps.Unlock()
	if !held {
		t.Fatal("no shared entry for the other capabilities")
	}
	runtime.KeepAlive(c)
	c = nil
	for range 3 {
		runtime.GC()
	}
	sharedCaps.Lock()
	r, ok := sharedCaps.m[string(key)]
	sharedCaps.Unlock()
	if ok && r.first.Value() != nil {
		t.Error("an array no record holds is still there after GC")
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSharedLabels: records with the same labels share one map, equal to
// what json.Unmarshal makes; other labels, none, null and {} decode as
// json.Unmarshal decodes them; labels that are no object are refused.
func TestSharedLabels(t *testing.T) {
	record := func(node, labels string) []byte {
		return []byte(`{"node_id":"` + node + `","tenant":"acme"` + labels + `}`)
	}
	a, err := decodeRecord(record("a", `,"labels":{"site":"x","zone":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := decodeRecord(record("b", `,"labels":{"site":"x","zone":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	if reflect.ValueOf(a.Labels).UnsafePointer() != reflect.ValueOf(b.Labels).UnsafePointer() {
		t.Error("two records of the same labels hold two maps")
	}
	for _, labels := range []string{`,"labels":{"site":"x","zone":"a"}`, `,"labels":{"site":"y"}`, ``, `,"labels":null`, `,"labels":{}`} {
		got, err := decodeRecord(record("c", labels))
		var want Node
		if json.Unmarshal(record("c", labels), &want) != nil || err != nil || !reflect.DeepEqual(got.Labels, want.Labels) {
			t.Errorf("labels%s: decoded %#v (%v), json.Unmarshal %#v", labels, got.Labels, err, want.Labels)
		}
	}
	if _, err := decodeRecord(record("d", `,"labels":["x"]`)); err == nil {
		t.Error("labels that are no object decoded")
	}
}
