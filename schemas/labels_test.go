package schemas_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

func TestValidNodeName(t *testing.T) {
	for _, s := range []string{"a", "0", "kitchen-pi", "pi.local", "a-", "a.", "a..b", strings.Repeat("a", 63)} {
		if !schemas.ValidNodeName(s) {
			t.Errorf("ValidNodeName(%q) = false, want true", s)
		}
	}
	for _, s := range []string{"", "-a", ".a", "A", "kitchen_pi", "pi local", "pi/x", "é", strings.Repeat("a", 64), "a\n"} {
		if schemas.ValidNodeName(s) {
			t.Errorf("ValidNodeName(%q) = true, want false", s)
		}
	}
}

func TestNodeNameOf(t *testing.T) {
	for host, want := range map[string]string{
		"kitchen-pi":                    "kitchen-pi",
		"My_Laptop.local":               "my-laptop.local",
		"-lead":                         "lead",
		"__":                            "",
		"":                              "",
		"host name":                     "host-name",
		"ÉTÉ":                           "t--", // é is two bytes, each mapped; the leading ones dropped
		strings.Repeat("h", 80):         strings.Repeat("h", 63),
		"..." + strings.Repeat("x", 70): strings.Repeat("x", 63),
	} {
		got := schemas.NodeNameOf(host)
		if got != want {
			t.Errorf("NodeNameOf(%q) = %q, want %q", host, got, want)
		}
		if got != "" && !schemas.ValidNodeName(got) {
			t.Errorf("NodeNameOf(%q) = %q, not a valid name", host, got)
		}
	}
}

func TestCheckLabels(t *testing.T) {
	long := strings.Repeat("p", 63)
	prefix253 := strings.Join([]string{long, long, long, strings.Repeat("q", 61)}, ".") // 253
	if len(prefix253) != 253 {
		t.Fatalf("prefix253 is %d characters", len(prefix253))
	}
	valid := map[string]string{
		"site":                           "paris",
		"example.com/rack":               "r-12",
		"a":                              "",
		"A_b.c-D":                        "X_y.Z-9",
		strings.Repeat("k", 63):          strings.Repeat("v", 63),
		prefix253 + "/n":                 "v",
		"okso.io/fleet":                  "mock",
		"a-b.c-d/x":                      "1",
		"9/9":                            "9",
		"x.y/" + strings.Repeat("n", 63): "ok",
	}
	for k, v := range valid {
		if err := schemas.CheckLabels(map[string]string{k: v}); err != nil {
			t.Errorf("CheckLabels({%q: %q}) = %v, want nil", k, v, err)
		}
	}
	for _, tc := range []struct {
		k, v, rule string
	}{
		{"", "v", "without a name"},
		{"/n", "v", "not a DNS subdomain"},
		{"Example.com/n", "v", "not a DNS subdomain"},
		{"ex_ample.com/n", "v", "not a DNS subdomain"},
		{"-ex.com/n", "v", "not a DNS subdomain"},
		{"ex..com/n", "v", "not a DNS subdomain"},
		{"ex.com-/n", "v", "not a DNS subdomain"},
		{prefix253 + "q/n", "v", "longer than 253"},
		{"ex.com/", "v", "without a name"},
		{"a/b/c", "v", "not [A-Za-z0-9-_.]"},
		{strings.Repeat("k", 64), "v", "longer than 63"},
		{"-k", "v", "not [A-Za-z0-9-_.]"},
		{"k-", "v", "not [A-Za-z0-9-_.]"},
		{"k k", "v", "not [A-Za-z0-9-_.]"},
		{"k", "-v", "value not"},
		{"k", "v.", "value not"},
		{"k", "v v", "value not"},
		{"k", "é", "value not"},
		{"k", "<script>", "value not"},
		{"k", strings.Repeat("v", 64), "value longer than 63"},
	} {
		err := schemas.CheckLabels(map[string]string{tc.k: tc.v})
		if err == nil || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("CheckLabels({%q: %q}) = %v, want an error saying %q", tc.k, tc.v, err, tc.rule)
			continue
		}
		if tc.v != "" && len(tc.v) > 2 && strings.Contains(err.Error(), tc.v) {
			t.Errorf("CheckLabels({%q: %q}) = %v: echoes the value", tc.k, tc.v, err)
		}
	}
	many := map[string]string{}
	for i := range schemas.MaxLabels {
		many["k"+string(rune('a'+i))] = "v"
	}
	if err := schemas.CheckLabels(many); err != nil {
		t.Errorf("%d labels: %v", len(many), err)
	}
	many["kz"] = "v"
	if err := schemas.CheckLabels(many); err == nil || !strings.Contains(err.Error(), "more than 16") {
		t.Errorf("%d labels: %v, want more than 16", len(many), err)
	}
}

func TestParseLabel(t *testing.T) {
	for s, want := range map[string][2]string{"a=b": {"a", "b"}, "x.io/k=": {"x.io/k", ""}, "k=v=w": {"k", ""}} {
		k, v, err := schemas.ParseLabel(s)
		if s == "k=v=w" {
			if err == nil {
				t.Errorf("ParseLabel(%q) = %q, %q; want an error", s, k, v)
			}
			continue
		}
		if err != nil || k != want[0] || v != want[1] {
			t.Errorf("ParseLabel(%q) = %q, %q, %v; want %q, %q", s, k, v, err, want[0], want[1])
		}
	}
	for _, s := range []string{"", "k", "=v", "-k=v"} {
		if _, _, err := schemas.ParseLabel(s); err == nil {
			t.Errorf("ParseLabel(%q): want an error", s)
		}
	}
}

func TestMergeLabels(t *testing.T) {
	device := map[string]string{"site": "device-says", "role": "edge"}
	token := map[string]string{"site": "token-says", "team": "ops"}
	file := map[string]string{"site": "file-says"}
	got := schemas.MergeLabels(device, token, file)
	want := map[string]string{"site": "file-says", "role": "edge", "team": "ops"}
	if !maps.Equal(got, want) {
		t.Errorf("MergeLabels = %v, want %v", got, want)
	}
	if device["site"] != "device-says" {
		t.Error("MergeLabels modified its base")
	}
	if got := schemas.MergeLabels(nil, nil); got != nil {
		t.Errorf("MergeLabels(nil, nil) = %v, want nil", got)
	}
}

// manifestWith is a valid manifest carrying name and labels (either may
// be left out by passing "" or nil).
func manifestWith(t testing.TB, name string, labels map[string]string) []byte {
	m := map[string]any{
		"node_id": node, "agent": map[string]string{"name": "okso-agent", "version": "1"},
		"capabilities": []map[string]any{{"cap_id": "echo", "kind": schemas.KindEcho, "schema_ref": schemas.EchoInput,
			"verbs": []string{"invoke"}, "safety_class": schemas.SafetyReadOnly}},
		"features": []string{"labels"},
	}
	if name != "" {
		m["name"] = name
	}
	if labels != nil {
		m["labels"] = labels
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkAgainstManifest holds the Go rules to the manifest schema's
// patterns: equal for names and values; for keys, equal but for the
// prefix's length, which only the Go rule checks.
func checkAgainstManifest(t *testing.T, s *schemas.Set, text string) {
	if name := schemas.ValidNodeName(text); name != (s.ValidateJSON(schemas.Manifest, manifestWith(t, text, nil)) == nil) && text != "" {
		t.Errorf("name %q: ValidNodeName = %v, the manifest schema disagrees", text, name)
	}
	value := schemas.CheckLabelValue(text) == nil
	if schema := s.ValidateJSON(schemas.Manifest, manifestWith(t, "", map[string]string{"k": text})) == nil; value != schema {
		t.Errorf("value %q: CheckLabelValue ok = %v, manifest schema ok = %v", text, value, schema)
	}
	key := schemas.CheckLabelKey(text) == nil
	schema := s.ValidateJSON(schemas.Manifest, manifestWith(t, "", map[string]string{text: "v"})) == nil
	prefix, _, _ := strings.Cut(text, "/")
	if key && !schema || schema && !key && len(prefix) <= schemas.MaxLabelPrefix {
		t.Errorf("key %q: CheckLabelKey ok = %v, manifest schema ok = %v", text, key, schema)
	}
}

func TestLabelRulesMatchTheManifest(t *testing.T) {
	s := load(t)
	for _, text := range labelSeeds() {
		checkAgainstManifest(t, s, text)
	}
}

func labelSeeds() []string {
	long := strings.Repeat("p", 63)
	return []string{"", "a", "A", "-", "a-", "a.", "a_b", "a/b", "x.io/k", "X.io/k", "a//b", "/", "k/", "/k",
		"a\n", "é", "a b", strings.Repeat("k", 63), strings.Repeat("k", 64),
		strings.Join([]string{long, long, long, long}, ".") + "/n", long + "." + long + "/n"}
}

func FuzzLabelRules(f *testing.F) {
	for _, s := range labelSeeds() {
		f.Add(s)
	}
	s, err := schemas.Load()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkAgainstManifest(t, s, text)
	})
}
