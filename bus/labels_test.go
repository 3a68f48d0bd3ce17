package bus_test

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/okso-io/okso/bus"
)

// TestRecordNameAndLabels: a record carries a node's name and labels
// through the registry; without them it is the record older readers
// know, byte for byte in its keys, and a reader older than them reads
// one that has them (it ignores what it does not know).
func TestRecordNameAndLabels(t *testing.T) {
	_, nc := startBus(t)
	r := openRegistry(t, nc, bus.RegistryOptions{})
	n := newNode("s1")
	n.Name, n.Labels = "kitchen-pi", map[string]string{"site": "paris"}
	claim(t, r, n)
	got, err := r.Get(ctx(t), n.NodeID)
	if err != nil || got == nil || got.Name != "kitchen-pi" || !maps.Equal(got.Labels, n.Labels) {
		t.Fatalf("Get = %+v, %v; want the name and labels", got, err)
	}

	b, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	var older struct { // of bus.Node before names and labels
		NodeID string `json:"node_id"`
	}
	if err := json.Unmarshal(b, &older); err != nil || older.NodeID != n.NodeID {
		t.Fatalf("an older reader: %+v, %v", older, err)
	}

	n.Name, n.Labels = "", nil
	if b, err = json.Marshal(n); err != nil {
		t.Fatal(err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "labels"} {
		if _, ok := keys[k]; ok {
			t.Errorf("a record without %s carries the key: %s", k, b)
		}
	}
}
