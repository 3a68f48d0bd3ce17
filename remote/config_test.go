package remote

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// env is a getenv over a fixed set of variables.
func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
}

// The example of DESIGN.md §9.1, completed, parses into what it says.
func TestLoadDesignExample(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "remotes.yaml"), env(map[string]string{"WEB_TOKEN": "t0k$n"}))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{Upstreams: []Upstream{
		{
			Name:       "everything",
			Transport:  "stdio",
			Command:    []string{"npx", "-y", "@modelcontextprotocol/server-everything"},
			Env:        map[string]string{"LOG_LEVEL": "warn"},
			Tenants:    []string{"demo"},
			Allow:      []string{"echo", "get-sum"},
			Safety:     map[string]string{"echo": "read_only", "*": "mutating"},
			Idempotent: []string{"echo", "get-sum"},
			Timeout:    10 * time.Second,
			Refresh:    60 * time.Second,
		},
		{
			Name:      "web",
			Transport: "http",
			URL:       "https://tools.example.com/mcp",
			Headers:   map[string]string{"Authorization": "Bearer t0k$n"},
			Tenants:   []string{"*"},
			Allow:     []string{"search_*"},
			Safety:    map[string]string{"search_*": "read_only"},
			Timeout:   10 * time.Second,
			Refresh:   5 * time.Minute,
		},
		{
			Name:      "ext",
			Transport: "action",
			Command:   []string{"scripts/mcp_echo.sh"},
			Tenants:   []string{"demo"},
			Allow:     []string{"echo_external"},
			Safety:    map[string]string{"echo_external": "read_only"},
			Timeout:   10 * time.Second,
			Refresh:   60 * time.Second,
		},
	}}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}

	// The same file without WEB_TOKEN names the header's line.
	_, err = Load(filepath.Join("testdata", "remotes.yaml"), nil)
	wantErr := filepath.Join("testdata", "remotes.yaml") + ":16: upstreams[1].headers.Authorization: ${WEB_TOKEN} is not set in the environment"
	if err == nil || err.Error() != wantErr {
		t.Errorf("without WEB_TOKEN: got %v, want %s", err, wantErr)
	}
}

// DESIGN.md §9.1's example as written leaves tenants and allow out for web
// and ext, which deny by default refuses.
func TestDesignExampleAsWritten(t *testing.T) {
	const doc = `upstreams:
  - name: everything
    transport: stdio
    command: [npx, -y, "@modelcontextprotocol/server-everything"]
    env: {LOG_LEVEL: warn}
    tenants: [demo]
    allow: [echo, get-sum]
    safety: {echo: read_only, "*": mutating}
    idempotent: [echo, get-sum]
    timeout: 10s
  - name: web
    transport: http
    url: https://tools.example.com/mcp
    headers: {Authorization: "Bearer ${WEB_TOKEN}"}
`
	_, err := Parse([]byte(doc), "remotes.yaml", env(map[string]string{"WEB_TOKEN": "x"}))
	if err == nil || !strings.HasPrefix(err.Error(), "remotes.yaml:11: upstreams[1].tenants: missing") {
		t.Errorf("got %v", err)
	}
}

// Every error is one line that names the file, the line and the field.
func TestParseErrors(t *testing.T) {
	// good is an upstream that passes, to put around a bad one.
	const good = `  - name: good
    transport: stdio
    command: [x]
    tenants: [t]
    allow: [x]
    safety: {x: read_only}
`
	for _, tc := range []struct {
		name  string
		doc   string
		env   map[string]string
		line  int    // 0: none named
		field string // "": none named
		msg   string // a part of the message
	}{
		// The brief's own example.
		{"bad transport", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n  - name: b\n    transport: ftp\n",
			nil, 7, "upstreams[1].transport", `"ftp" is not one of stdio, http, action`},
		{"bad transport after a good one", "upstreams:\n" + good + "  - name: a\n    transport: ftp\n",
			nil, 9, "upstreams[1].transport", `"ftp" is not one of stdio, http, action`},

		// Unknown keys, at every level.
		{"unknown top key", "upstreams: []\nversion: 1\n", nil, 2, "version", "unknown key; the file has only upstreams"},
		{"unknown upstream key", `upstreams:
  - name: a
    transport: stdio
    comand: [x]
    command: [x]
    tenants: [t]
    allow: [x]
`, nil, 4, "upstreams[0].comand", "unknown key; an upstream has name, transport"},
		{"two unknown keys, the first named", `upstreams:
  - name: a
    zz: 1
    aa: 2
`, nil, 3, "upstreams[0].zz", "unknown key"},
		{"bad env name", `upstreams:
  - name: a
    transport: stdio
    command: [x]
    env:
      GOOD: "1"
      1BAD: "2"
    tenants: [t]
    allow: [x]
    safety: {x: read_only}
`, nil, 7, "upstreams[0].env[\"1BAD\"]", "not an environment variable name"},
		{"bad header name", `upstreams:
  - name: a
    transport: http
    url: https://example.com
    headers: {"X Id": "1"}
    tenants: [t]
    allow: [x]
`, nil, 5, `upstreams[0].headers["X Id"]`, "not an HTTP header name"},
		{"empty safety key", `upstreams:
  - name: a
    transport: stdio
    command: [x]
    tenants: [t]
    allow: [x]
    safety: {"": read_only}
`, nil, 7, `upstreams[0].safety[""]`, "not a tool name or glob"},

		// Names.
		{"bad name", "upstreams:\n  - name: Web\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].name", `"Web" is not an upstream name`},
		{"long name", "upstreams:\n  - name: abcdefghijklmnopq\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].name", "is not an upstream name"},
		{"name a number", "upstreams:\n  - name: 12\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].name", "want a string, not a number (quote it)"},
		{"reserved name", "upstreams:\n  - name: okso\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].name", `"okso" is reserved`},
		{"reserved fleet", "upstreams:\n" + good + "  - name: fleet\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 8, "upstreams[1].name", `"fleet" is reserved`},
		{"duplicate names", "upstreams:\n" + good + `  - name: other
    transport: stdio
    command: [x]
    tenants: [t]
    allow: [x]
    safety: {x: read_only}
` + good, nil, 14, "upstreams[2].name", `"good" is already the name of upstreams[0] (line 2)`},

		// Missing fields, per transport.
		{"missing upstreams", "# nothing\n{}\n", nil, 2, "upstreams", "missing; the file lists its upstreams"},
		{"missing name", "upstreams:\n  - transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].name", "missing"},
		{"missing allow", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n",
			nil, 2, "upstreams[0].allow", "missing; deny by default"},
		{"missing tenants", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    allow: [x]\n",
			nil, 2, "upstreams[0].tenants", "missing"},
		{"stdio without command", "upstreams:\n  - name: a\n    transport: stdio\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].command", "missing; transport stdio runs a command"},
		{"action without command", "upstreams:\n" + good + "  - name: b\n    transport: action\n    tenants: [t]\n    allow: [x]\n",
			nil, 8, "upstreams[1].command", "missing; transport action runs a command"},
		{"action with empty command", "upstreams:\n  - name: a\n    transport: action\n    command: []\n    tenants: [t]\n    allow: [x]\n",
			nil, 4, "upstreams[0].command", "empty; name the program to run"},
		{"http without url", "upstreams:\n  - name: a\n    transport: http\n    tenants: [t]\n    allow: [x]\n",
			nil, 2, "upstreams[0].url", "missing; transport http needs the server's url"},
		{"http with a bad url", "upstreams:\n  - name: a\n    transport: http\n    url: ftp://user:pw@example.com\n    tenants: [t]\n    allow: [x]\n",
			nil, 4, "upstreams[0].url", "not an http:// or https:// URL"},
		{"stdio with url", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    url: http://x\n",
			nil, 7, "upstreams[0].url", "not for transport stdio; url and headers are for http"},
		{"action with headers", "upstreams:\n  - name: a\n    transport: action\n    command: [x]\n    headers:\n      A: b\n    tenants: [t]\n    allow: [x]\n",
			nil, 5, "upstreams[0].headers", "not for transport action"},
		{"http with command", "upstreams:\n  - name: a\n    transport: http\n    url: http://x\n    command: [x]\n    tenants: [t]\n    allow: [x]\n",
			nil, 5, "upstreams[0].command", "not for transport http; command and env are for stdio and action"},
		{"http with env", "upstreams:\n  - name: a\n    transport: http\n    url: http://x\n    env: {A: b}\n    tenants: [t]\n    allow: [x]\n",
			nil, 5, "upstreams[0].env", "not for transport http"},

		// Values.
		{"empty allow", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: []\n",
			nil, 6, "upstreams[0].allow", "empty; deny by default"},
		{"empty tenants", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: []\n    allow: [x]\n",
			nil, 5, "upstreams[0].tenants", "empty; list the tenants"},
		{"bad tenant", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants:\n      - ok\n      - a b\n    allow: [x]\n",
			nil, 7, "upstreams[0].tenants[1]", `"a b" is not a tenant`},
		{"bad safety class", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety:\n      x: safe\n",
			nil, 8, "upstreams[0].safety.x", `"safe" is not one of read_only, mutating, destructive`},
		{"safety class a number", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety: {x: 1}\n",
			nil, 7, "upstreams[0].safety.x", "1 is not one of read_only, mutating, destructive"},
		{"env value a number", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    env: {PORT: 8080}\n    tenants: [t]\n    allow: [x]\n",
			nil, 5, "upstreams[0].env.PORT", "want a string, not a number (quote it)"},
		{"idempotent not a list", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    idempotent: x\n",
			nil, 7, "upstreams[0].idempotent", "want a list, not a string"},
		{"upstreams a mapping", "upstreams:\n  name: a\n", nil, 1, "upstreams", "want a list, not a mapping"},
		{"not a mapping", "- a\n", nil, 1, "", "want a mapping, not a list"},

		// Durations.
		{"timeout without a unit", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    timeout: 10\n",
			nil, 7, "upstreams[0].timeout", "want a string, not a number"},
		{"timeout in words", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    timeout: 10 sec\n",
			nil, 7, "upstreams[0].timeout", `"10 sec" is not a duration such as 10s`},
		{"negative refresh", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    refresh: -1s\n",
			nil, 7, "upstreams[0].refresh", `"-1s" is not a duration`},
		{"zero timeout", "upstreams:\n" + good + "    timeout: 0s\n", nil, 8, "upstreams[0].timeout", `"0s" is not above 0`},
		{"long timeout", "upstreams:\n" + good + "    timeout: 5m1s\n", nil, 8, "upstreams[0].timeout", `"5m1s" is above 5m0s`},
		{"short refresh", "upstreams:\n" + good + "    refresh: 999ms\n", nil, 8, "upstreams[0].refresh", `"999ms" is below 1s`},
		{"huge refresh", "upstreams:\n" + good + "    refresh: 9999999999h\n", nil, 8, "upstreams[0].refresh", "out of range"},

		// ${VAR} in headers.
		{"missing variable", `upstreams:
  - name: a
    transport: http
    url: https://example.com
    headers:
      X-Ok: "${OK}"
      Authorization: "Bearer ${TOKEN}"
    tenants: [t]
    allow: [x]
    safety: {x: read_only}
`, map[string]string{"OK": "1"}, 7, "upstreams[0].headers.Authorization", "${TOKEN} is not set in the environment"},
		{"shell variable", "upstreams:\n  - name: a\n    transport: http\n    url: https://example.com\n    headers: {A: \"$TOKEN\"}\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n",
			map[string]string{"TOKEN": "x"}, 5, "upstreams[0].headers.A", `a "$" begins ${NAME} or is written $$`},
		{"unterminated variable", "upstreams:\n  - name: a\n    transport: http\n    url: https://example.com\n    headers: {A: \"${TOKEN\"}\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n",
			map[string]string{"TOKEN": "x"}, 5, "upstreams[0].headers.A", `a "$" begins ${NAME}`},
		{"bad variable name", "upstreams:\n  - name: a\n    transport: http\n    url: https://example.com\n    headers: {A: \"${1X}\"}\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n",
			nil, 5, "upstreams[0].headers.A", "${1X} names no variable"},
		{"variable with a line break", "upstreams:\n  - name: a\n    transport: http\n    url: https://example.com\n    headers: {A: \"${TOKEN}\"}\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n",
			map[string]string{"TOKEN": "x\r\nHost: evil"}, 5, "upstreams[0].headers.A", "${TOKEN} holds a control character"},
		{"header with a line break", "upstreams:\n  - name: a\n    transport: http\n    url: https://example.com\n    headers: {A: \"x\\nHost: evil\"}\n    tenants: [t]\n    allow: [x]\n",
			nil, 5, "upstreams[0].headers.A", "holds a control character"},

		// Globs and classes.
		{"bad allow glob", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow:\n      - x\n      - \"get-[\"\n    safety: {\"*\": read_only}\n",
			nil, 8, "upstreams[0].allow[1]", `"get-[" is not a valid glob`},
		{"bad safety glob", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety:\n      x: read_only\n      \"[z\": mutating\n",
			nil, 9, `upstreams[0].safety["[z"]`, `"[z" is not a valid glob`},
		{"bad idempotent glob", "upstreams:\n" + good + "    idempotent: [x, \"\\\\\"]\n", nil, 8, "upstreams[0].idempotent[1]", `"\\" is not a valid glob`},
		{"unclassified tool", `upstreams:
  - name: a
    transport: stdio
    command: [x]
    tenants: [t]
    allow: [echo, get-sum]
    safety: {echo: read_only}
`, nil, 6, "upstreams[0].allow[1]", `allows get-sum, which no safety entry classes (an upstream's own hints are not trusted); add safety: {get-sum: read_only} or a "*" entry`},
		{"unclassified glob", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [\"get-*\"]\n    safety: {\"get*\": read_only}\n",
			nil, 6, "upstreams[0].allow[0]", `allows "get-*", which no safety entry classes`},
		{"no safety at all", "upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow:\n      - echo\n",
			nil, 7, "upstreams[0].allow[0]", "allows echo, which no safety entry classes"},

		// MCP_ENDPOINT.
		{"endpoint taken", "upstreams:\n" + good + "  - name: endpoint\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n",
			map[string]string{"MCP_ENDPOINT": "okso endpoint --url http://x"}, 8, "upstreams[1].name", `"endpoint" is the upstream MCP_ENDPOINT adds; rename this one or unset MCP_ENDPOINT`},

		// YAML itself.
		{"duplicate key", "upstreams:\n  - name: a\n    transport: stdio\n    name: b\n", nil, 4, "upstreams[0].name", "given twice, first at line 2"},
		{"duplicate key in a flow mapping", "upstreams:\n  - {name: a, transport: stdio, command: [x], tenants: [t], allow: [x], safety: {x: read_only, x: mutating}}\n",
			nil, 2, "upstreams[0].safety.x", "given twice, first at line 2"},
		{"merge key", "base: &b {transport: stdio}\nupstreams:\n  - <<: *b\n    name: a\n", nil, 3, "upstreams[0]", "merge keys (<<) are not supported"},
		{"two documents", "upstreams: []\n---\nupstreams: []\n", nil, 2, "", "a second YAML document"},
		{"empty file", "", nil, 0, "", "the file is empty"},
		{"only comments", "# upstreams:\n", nil, 0, "", "the file is empty"},
		{"syntax error", "upstreams:\n  - name: a\n   transport: [\n", nil, 2, "", "not YAML: "},
		{"scanner error", "upstreams:\n  - name: a\n    b: c: d\n", nil, 3, "", "not YAML: mapping values are not allowed in this context"},
		{"parser error", "upstreams: []\nb: }\n", nil, 2, "", "not YAML: did not find expected node content"},
		{"a list as a key", "upstreams: []\n? [a]\n: 1\n", nil, 2, "", "a key must be a plain name"},
		{"aliases that expand too far", billionLaughs(), nil, 0, "", "the config expands to more than 100000 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), "remotes.yaml", env(tc.env))
			if err == nil {
				t.Fatal("Parse: no error")
			}
			msg := err.Error()
			if strings.ContainsAny(msg, "\r\n") {
				t.Errorf("not one line: %q", msg)
			}
			prefix := "remotes.yaml:"
			if tc.line > 0 {
				prefix += fmt.Sprint(tc.line) + ":"
			}
			prefix += " "
			if tc.field != "" {
				prefix += tc.field + ": "
			}
			if !strings.HasPrefix(msg, prefix) || !strings.Contains(msg[len(prefix):], tc.msg) {
				t.Errorf("got  %s\nwant %s...%s...", msg, prefix, tc.msg)
			}
			for _, secret := range []string{"evil", "pw@", "8080"} {
				if strings.Contains(msg, secret) {
					t.Errorf("the message shows a header, env or url value: %s", msg)
				}
			}
		})
	}
}

// billionLaughs is a small file whose aliases expand to a million values.
func billionLaughs() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 6; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	b.WriteString("upstreams: []\n")
	return b.String()
}

func TestParseDefaultsAndExpansion(t *testing.T) {
	const doc = `upstreams:
  - name: h
    transport: http
    url: http://127.0.0.1:1/mcp
    headers:
      Authorization: "Bearer ${A}${B}"
      X-Price: "$$5 and $${A}"
      X-Empty: "${EMPTY}"
    tenants: [t1, "*"]
    allow: ["*"]
    safety: {"*": destructive}
    timeout: 5m
    refresh: 1s
  - name: s
    transport: stdio
    command: [node, server.js]
    env: {}
    tenants: [t]
    allow: [get-sum]
    safety: {"get-*": read_only}
    idempotent: []
`
	c, err := Parse([]byte(doc), "x.yaml", env(map[string]string{"A": "a$", "B": "}", "EMPTY": ""}))
	if err != nil {
		t.Fatal(err)
	}
	h, s := c.Upstreams[0], c.Upstreams[1]
	if want := map[string]string{"Authorization": "Bearer a$}", "X-Price": "$5 and ${A}", "X-Empty": ""}; !reflect.DeepEqual(h.Headers, want) {
		t.Errorf("headers %q, want %q", h.Headers, want)
	}
	if h.Timeout != 5*time.Minute || h.Refresh != time.Second {
		t.Errorf("durations %v %v", h.Timeout, h.Refresh)
	}
	if s.Timeout != 10*time.Second || s.Refresh != time.Minute {
		t.Errorf("defaults %v %v", s.Timeout, s.Refresh)
	}
	if s.Env == nil || len(s.Env) != 0 || s.Idempotent == nil || len(s.Idempotent) != 0 || s.Headers != nil {
		t.Errorf("an empty env or list is kept empty, a missing one nil: %#v", s)
	}
	if len(c.Upstreams) != 2 {
		t.Errorf("%d upstreams, want 2", len(c.Upstreams))
	}
}

func TestMCPEndpoint(t *testing.T) {
	endpoint := Upstream{
		Name:      "endpoint",
		Transport: "action",
		Command:   []string{"okso", "endpoint", "--url", "http://127.0.0.1:8080/mcp"},
		Tenants:   []string{"*"},
		Allow:     []string{"*"},
		Safety:    map[string]string{"*": "mutating"},
		Timeout:   10 * time.Second,
		Refresh:   60 * time.Second,
	}
	withEnd := env(map[string]string{"MCP_ENDPOINT": "  okso endpoint\t--url http://127.0.0.1:8080/mcp "})

	// Without a config file.
	c, err := Load("", withEnd)
	if err != nil {
		t.Fatal(err)
	}
	if want := (&Config{Upstreams: []Upstream{endpoint}}); !reflect.DeepEqual(c, want) {
		t.Errorf("no file: got %+v, want %+v", c, want)
	}
	for _, getenv := range []func(string) (string, bool){nil, env(nil), env(map[string]string{"MCP_ENDPOINT": " \t"})} {
		if c, err := Load("", getenv); err != nil || len(c.Upstreams) != 0 {
			t.Errorf("no file and no MCP_ENDPOINT: %+v, %v", c, err)
		}
	}

	// With one: the endpoint comes last.
	const doc = "upstreams:\n  - name: a\n    transport: action\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n"
	c, err = Parse([]byte(doc), "r.yaml", withEnd)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Upstreams) != 2 || c.Upstreams[0].Name != "a" || !reflect.DeepEqual(c.Upstreams[1], endpoint) {
		t.Errorf("with a file: %+v", c.Upstreams)
	}
	if c.Upstreams[1].SafetyOf("anything") != "mutating" || !c.Upstreams[1].Allowed("anything") {
		t.Error("the endpoint does not allow every tool as mutating")
	}

	// Without MCP_ENDPOINT, endpoint is a name like any other.
	const named = "upstreams:\n  - name: endpoint\n    transport: action\n    command: [x]\n    tenants: [t]\n    allow: [x]\n    safety: {x: read_only}\n"
	if c, err := Parse([]byte(named), "r.yaml", nil); err != nil || len(c.Upstreams) != 1 {
		t.Errorf("an upstream named endpoint: %+v, %v", c, err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "remotes.yaml")
	if err := os.WriteFile(p, []byte("upstreams:\n  - name: a\n    transport: ftp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p, nil)
	if want := p + `:3: upstreams[0].transport: "ftp" is not one of stdio, http, action`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	if _, err := Load(filepath.Join(dir, "none.yaml"), nil); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("a missing file: %v", err)
	}
}

func TestAllowedSafetyIdempotent(t *testing.T) {
	u := &Upstream{
		Allow: []string{"echo", "get-*", "list_?", "a/*", `lit\*`},
		Safety: map[string]string{
			"echo":   "read_only",
			"get-*":  "read_only",
			"get-s*": "mutating",
			"get-?x": "destructive", // as long as get-s*, sorts first
			"*":      "destructive",
		},
		Idempotent: []string{"echo", "list_*"},
	}
	for _, tc := range []struct {
		tool       string
		allowed    bool
		safety     string
		idempotent bool
	}{
		{"echo", true, "read_only", true},
		{"echo2", false, "destructive", false},
		{"get-sum", true, "mutating", false},    // the longest glob wins
		{"get-ax", true, "destructive", false},  // of two as long, the first in order
		{"get-sx", true, "destructive", false},  // get-?x sorts before get-s*
		{"get-", true, "read_only", false},      // get-* matches an empty rest
		{"list_a", true, "destructive", true},   // only "*" classes it
		{"list_ab", false, "destructive", true}, // ? is one character
		{"a/b", true, "destructive", false},     // "*" classes names with a slash too
		{"lit*", true, "destructive", false},    // an escaped star is a literal
		{"litx", false, "destructive", false},
		{"", false, "destructive", false},
	} {
		if got := u.Allowed(tc.tool); got != tc.allowed {
			t.Errorf("Allowed(%q) = %v", tc.tool, got)
		}
		if got := u.SafetyOf(tc.tool); got != tc.safety {
			t.Errorf("SafetyOf(%q) = %q, want %q", tc.tool, got, tc.safety)
		}
		if got := u.IsIdempotent(tc.tool); got != tc.idempotent {
			t.Errorf("IsIdempotent(%q) = %v", tc.tool, got)
		}
	}
	// Without "*", an unclassified name has no class.
	v := &Upstream{Allow: []string{"x"}, Safety: map[string]string{"x": "read_only"}}
	if got := v.SafetyOf("y"); got != "" {
		t.Errorf("SafetyOf(y) = %q, want none", got)
	}
	if v.IsIdempotent("x") {
		t.Error("no idempotent list, yet x is idempotent")
	}
}

// Parse's promise: every tool an upstream allows has a class.
func FuzzParse(f *testing.F) {
	for _, doc := range []string{
		"upstreams:\n  - name: a\n    transport: stdio\n    command: [x]\n    tenants: [t]\n    allow: [echo, \"get-*\"]\n    safety: {\"get-*\": read_only, \"e*\": mutating}\n",
		"upstreams:\n  - name: a\n    transport: http\n    url: http://x\n    tenants: [\"*\"]\n    allow: [\"[a-c]?\", b]\n    safety: {\"[a-c]?\": read_only, \"?\": mutating}\n",
		"upstreams:\n  - name: a\n    transport: action\n    command: [x]\n    tenants: [t]\n    allow: [\"*\"]\n    safety: {\"*\": destructive}\n",
	} {
		f.Add([]byte(doc), "get-sum")
		f.Add([]byte(doc), "bx")
	}
	f.Fuzz(func(t *testing.T, doc []byte, tool string) {
		c, err := Parse(doc, "f.yaml", nil)
		if err != nil {
			if strings.ContainsAny(err.Error(), "\r\n") {
				t.Fatalf("not one line: %q", err)
			}
			return
		}
		for _, u := range c.Upstreams {
			for _, name := range append(slices.Clone(u.Allow), tool) {
				if u.Allowed(name) && u.SafetyOf(name) == "" {
					t.Fatalf("%s allows %q with no class: %+v", u.Name, name, u)
				}
			}
		}
	})
}
