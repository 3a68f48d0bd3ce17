package schemas

import (
	"encoding/json"
	"slices"
	"testing"
)

// TestUpstreamNamespace: the config schema refuses as an upstream name
// exactly what ValidUpstream refuses beyond its pattern: okso's own names
// and every kind_short, a new kind's included.
func TestUpstreamNamespace(t *testing.T) {
	raw, err := files.ReadFile("remotes.config@1.0.0.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Defs struct {
			UpstreamName struct {
				Not struct {
					Enum []string `json:"enum"`
				} `json:"not"`
			} `json:"upstream_name"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(reserved)
	for _, k := range kinds {
		want = append(want, k.Short)
	}
	slices.Sort(want)
	got := slices.Sorted(slices.Values(doc.Defs.UpstreamName.Not.Enum))
	if !slices.Equal(got, want) {
		t.Errorf("the config schema refuses the upstream names %v; okso's own names and the kind_shorts are %v", got, want)
	}
	for _, name := range want {
		if ValidUpstream(name) {
			t.Errorf("ValidUpstream(%q) = true", name)
		}
	}
}
