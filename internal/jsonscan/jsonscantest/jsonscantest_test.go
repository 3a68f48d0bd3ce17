package jsonscantest_test

import (
	"encoding/json"
	"testing"

	"github.com/okso-io/okso/internal/jsonscan/jsonscantest"
)

type inner struct {
	B int `json:"b"`
}

type doc struct {
	A    string          `json:"a"`
	In   *inner          `json:"in,omitempty"`
	List []inner         `json:"list"`
	Raw  json.RawMessage `json:"raw"`
	Map  map[string]any  `json:"map"`
	Name string
	inner
}

// TestStrict: the oracle refuses what encoding/json takes but okso's
// strict decoders do not, and takes the rest.
func TestStrict(t *testing.T) {
	for _, c := range []struct {
		doc  string
		want bool
	}{
		{`{"a":"x","in":{"b":1},"list":[{"b":2}],"raw":{"k":1e400,"K":[{"k":1}]},"map":{"Z":null},"Name":"n","b":3}`, true},
		{` {"a":"x"} `, true},
		{`{"a":"x"}{}`, false},
		{`{"a":"x"`, false},
		{`{"a":"x","a":"y"}`, false},
		{`{"raw":{"k":1,"k":2}}`, false},
		{`{"map":{"k":[{"z":1,"z":1}]}}`, false},
		{`{"A":"x"}`, false},
		{`{"in":{"B":1}}`, false},
		{`{"list":[{"b":1},{"c":1}]}`, false},
		{`{"name":"n"}`, false},
		{`{"inner":{}}`, false},
		{`{"\u0061":"x"}`, true},
	} {
		var d doc
		if err := jsonscantest.Strict([]byte(c.doc), &d); (err == nil) != c.want {
			t.Errorf("Strict(%s): %v, want accepted %v", c.doc, err, c.want)
		}
	}
}
