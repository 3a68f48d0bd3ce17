package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/internal/yamlconf"
	"github.com/okso-io/okso/schemas"
)

// A device's own tools (DESIGN.md §12, seed 002's local registry) come
// from its operator's tools file (okso agent --tools), checked against
// agent.tools@1.0.0 when the agent starts. Each is announced as a
// capability of kind local.tool and run by [LocalHandler].

// Bounds of a local tool that the schema cannot state.
const (
	defaultToolTimeout = 10 * time.Second
	maxToolTimeout     = 60 * time.Second
	// maxDescription bounds the description announced: the operator's
	// words and the limits on the query (the manifest's maxLength).
	maxDescription = 1024
)

// LocalTool is one tool of a device's tools file, checked: a local tool
// (kind local.tool), or, when Kind is set, a capability of a kind the
// operator registered, served by its command as seed 002's call_tool.
type LocalTool struct {
	Name        string // the cap_id
	Description string // the operator's words (local tools only)
	// Kind, Verbs and SchemaRef: a registered kind's capability, as
	// announced. The agent has none of the kind's schemas: the gateway
	// checks the arguments before they reach the device, and the result.
	Kind        string
	Verbs       []string
	SchemaRef   string
	Command     []string
	Safety      string
	Timeout     time.Duration
	RateLimit   float64 // runs a second; 0: unlimited
	Concurrency int     // runs at once; 0: unlimited
	Env         map[string]string
	Dir         string
	Query       QueryRule
}

// QueryRule is what a local tool accepts in its query. Its zero value
// accepts any query the arguments schema does (4096 characters, no NUL)
// of at most [schemas.MaxLocalQuery] bytes.
type QueryRule struct {
	MaxLength int            // bytes; 0 with HasMax: only the empty query
	HasMax    bool           // MaxLength was given
	Pattern   *regexp.Regexp // the whole query must match; nil: any
	Enum      []string       // the queries allowed; nil: any
}

// check returns why q breaks the rule, or "".
func (r QueryRule) check(q string) string {
	switch {
	case len(q) > schemas.MaxLocalQuery:
		return fmt.Sprintf("longer than %d bytes", schemas.MaxLocalQuery)
	case r.HasMax && len(q) > r.MaxLength:
		return fmt.Sprintf("longer than %d bytes", r.MaxLength)
	case r.Enum != nil && !slices.Contains(r.Enum, q):
		return "not one of the queries the tool takes"
	case r.Pattern != nil && !r.Pattern.MatchString(q):
		return "does not match the tool's pattern"
	}
	return ""
}

// words states the rule for the model, or "" when there is none.
func (r QueryRule) words() string {
	var parts []string
	if r.Enum != nil {
		quoted := make([]string, len(r.Enum))
		for i, e := range r.Enum {
			quoted[i] = strconv.Quote(e)
		}
		parts = append(parts, "one of "+strings.Join(quoted, ", "))
	}
	if r.Pattern != nil {
		parts = append(parts, "matching the regular expression "+r.pattern())
	}
	if r.HasMax {
		parts = append(parts, fmt.Sprintf("at most %d bytes", r.MaxLength))
	}
	if parts == nil {
		return ""
	}
	return "query: " + strings.Join(parts, "; ") + "."
}

// pattern is the rule's pattern as written in the file.
func (r QueryRule) pattern() string {
	s := r.Pattern.String()
	return strings.TrimSuffix(strings.TrimPrefix(s, "^(?:"), ")$")
}

// Announced is the description the tool's capability carries: the
// operator's words, then the limits on the query.
func (t LocalTool) Announced() string {
	if w := t.Query.words(); w != "" {
		return t.Description + "\n" + w
	}
	return t.Description
}

// Capability is the tool's capability in the manifest.
func (t LocalTool) Capability() schemas.Capability {
	if t.Kind != "" {
		return schemas.Capability{
			CapID:       t.Name,
			Kind:        t.Kind,
			SchemaRef:   t.SchemaRef,
			Verbs:       t.Verbs,
			SafetyClass: t.Safety,
			Constraints: schemas.Constraints{
				RateLimitRPS:      t.RateLimit,
				MaxConcurrency:    t.Concurrency,
				DeadlineMsDefault: int(t.Timeout / time.Millisecond),
			},
		}
	}
	return schemas.Capability{
		CapID:       t.Name,
		Kind:        schemas.KindLocal,
		SchemaRef:   schemas.LocalRunInput,
		Verbs:       []string{"run"},
		SafetyClass: t.Safety,
		Description: t.Announced(),
		Constraints: schemas.Constraints{
			RateLimitRPS:      t.RateLimit,
			MaxConcurrency:    t.Concurrency,
			DeadlineMsDefault: int(t.Timeout / time.Millisecond),
		},
	}
}

// LoadTools reads a tools file and checks it as [ParseTools] does.
func LoadTools(path string) ([]LocalTool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the tools file: %w", err)
	}
	return ParseTools(data, path)
}

var loadSchemas = sync.OnceValues(schemas.Load)

// ParseTools checks a tools file's contents against agent.tools@1.0.0,
// then what the schema cannot say: unique names, a timeout within 60 s,
// a pattern that compiles, a dir that is a directory, and an announced
// description within its bound. An error is one line naming the file
// (name), the line and the field, as in `tools.yaml:4:
// tools[0].safety: "harmless" is not one of read_only, mutating,
// destructive`. It never quotes an env value.
func ParseTools(data []byte, name string) ([]LocalTool, error) {
	set, err := loadSchemas()
	if err != nil {
		return nil, fmt.Errorf("load the tools file's schema: %w", err)
	}
	f := toolsForm()
	root, v, err := f.Checked(data, name, schemas.AgentTools, func(v any) error { return set.Validate(schemas.AgentTools, v) })
	if err != nil {
		return nil, err
	}
	items, _ := v.(map[string]any)["tools"].([]any)
	tools := make([]LocalTool, 0, len(items))
	seen := map[string]int{}
	for i, item := range items {
		m := item.(map[string]any)
		at := func(key ...string) []string { return append([]string{"tools", strconv.Itoa(i)}, key...) }
		t := LocalTool{
			Name:    m["name"].(string),
			Safety:  m["safety"].(string),
			Timeout: defaultToolTimeout,
		}
		t.Description, _ = m["description"].(string)
		if k, ok := m["kind"].(string); ok {
			if schemas.IsBuiltinKind(k) {
				return nil, f.ErrAt(name, root, at("kind"), "%s is built in: leave kind out for a local tool", yamlconf.Quote(k))
			}
			t.Kind, t.SchemaRef = k, m["schema_ref"].(string)
			for _, v := range m["verbs"].([]any) {
				t.Verbs = append(t.Verbs, v.(string))
			}
			if !strings.HasPrefix(t.SchemaRef, schemas.IDPrefix+k+".") {
				return nil, f.ErrAt(name, root, at("schema_ref"), "not an input schema of kind %s (%s%s.<verb>.input@<version>)", k, schemas.IDPrefix, k)
			}
		}
		if j, dup := seen[t.Name]; dup {
			return nil, f.ErrAt(name, root, at("name"), "%s is already the name of tools[%d]", yamlconf.Quote(t.Name), j)
		}
		seen[t.Name] = i
		for _, a := range m["command"].([]any) {
			t.Command = append(t.Command, a.(string))
		}
		if s, ok := m["timeout"].(string); ok {
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > maxToolTimeout {
				return nil, f.ErrAt(name, root, at("timeout"), "%s is not a duration above 0 and at most %v", yamlconf.Quote(s), maxToolTimeout)
			}
			if d%time.Millisecond != 0 {
				return nil, f.ErrAt(name, root, at("timeout"), "%s: give whole milliseconds", yamlconf.Quote(s))
			}
			t.Timeout = d
		}
		if r, ok := m["rate_limit_rps"]; ok {
			t.RateLimit, _ = number(r)
		}
		if c, ok := m["max_concurrency"]; ok {
			n, _ := number(c)
			t.Concurrency = int(n)
		}
		if env, ok := m["env"].(map[string]any); ok {
			t.Env = make(map[string]string, len(env))
			for k, v := range env {
				t.Env[k] = v.(string)
			}
		}
		if d, ok := m["dir"].(string); ok {
			if st, err := os.Stat(d); err != nil || !st.IsDir() {
				return nil, f.ErrAt(name, root, at("dir"), "%s is not a directory here", yamlconf.Quote(d))
			}
			t.Dir = d
		}
		if q, ok := m["query"].(map[string]any); ok {
			if n, ok := q["max_length"]; ok {
				l, _ := number(n)
				t.Query.MaxLength, t.Query.HasMax = int(l), true
			}
			if p, ok := q["pattern"].(string); ok {
				re, err := regexp.Compile("^(?:" + p + ")$")
				if err != nil {
					return nil, f.ErrAt(name, root, at("query", "pattern"), "not a Go regular expression: %v", err)
				}
				t.Query.Pattern = re
			}
			if e, ok := q["enum"].([]any); ok {
				t.Query.Enum = make([]string, len(e))
				for j, s := range e {
					t.Query.Enum[j] = s.(string)
				}
			}
		}
		if n := len(t.Announced()); n > maxDescription {
			return nil, f.ErrAt(name, root, at("description"), "with the limits on its query, %d bytes; at most %d", n, maxDescription)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// number reads a JSON number as the YAML converter gives it.
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case interface{ Float64() (float64, error) }:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

// toolKeys are a tool's keys, in the schema's order.
const toolKeys = "name, description, command, safety, timeout, rate_limit_rps, max_concurrency, env, dir, query (and kind, verbs, schema_ref for a registered kind)"

// toolsForm is the tools file's kind of file.
func toolsForm() *yamlconf.Form {
	return &yamlconf.Form{
		Empty: "want tools: followed by a list",
		IsIndex: func(loc []string, i int) bool {
			if _, err := strconv.Atoi(loc[i]); err != nil {
				return false
			}
			return loc[i-1] == "tools" && i == 1 || (loc[i-1] == "command" || loc[i-1] == "enum" || loc[i-1] == "verbs") && i >= 3
		},
		Describe: describeTools,
	}
}

// describeTools words one broken rule of the tools file. It never quotes
// an env value, which may be a secret.
func describeTools(root *yaml.Node, doc any, e *jsonschema.ValidationError) (field, at []string, msg string) {
	loc := e.InstanceLocation
	secret := len(loc) >= 3 && loc[2] == "env"
	shown := func() string { return yamlconf.Shown(yamlconf.ValueAt(doc, loc), secret) }
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		at := append(slices.Clone(loc), yamlconf.FirstByLine(root, loc, k.Properties))
		switch {
		case len(loc) == 0:
			return at, at, "unknown key; the file has only tools"
		case len(loc) == 2:
			return at, at, "unknown key; a tool has " + toolKeys
		case last == "env":
			return at, at, "not an environment variable name (A-Z, a-z, 0-9 and _, not first a digit)"
		case last == "query":
			return at, at, "unknown key; a query rule has max_length, pattern, enum"
		}
		return at, at, "unknown key"
	case *kind.Required:
		missing := k.Missing[0]
		at := append(slices.Clone(loc), missing)
		switch missing {
		case "tools":
			return at, loc, "missing; the file lists the device's tools under tools:"
		case "safety":
			return at, loc, "missing; say what running it can do: read_only, mutating or destructive (there is no default)"
		case "command":
			return at, loc, "missing; the program and its arguments, as a list (no shell)"
		case "description":
			return at, loc, "missing; what the tool does, for the model that calls it"
		case "verbs":
			return at, loc, "missing; the verbs of the kind the command serves"
		case "schema_ref":
			return at, loc, "missing; the input schema $id of one of the kind's verbs, whose version says the kind's major"
		}
		return at, loc, "missing"
	case *kind.FalseSchema:
		if len(loc) >= 3 && loc[2] == "env" {
			return loc, loc, "TOOL_QUERY is the query's: the agent sets it"
		}
		switch last {
		case "description", "query":
			return loc, loc, "not for a registered kind's capability (with kind): its kind's definition says what it does"
		case "verbs", "schema_ref":
			return loc, loc, "only with kind: a registered kind's capability"
		}
		return loc, loc, "not allowed here"
	case *kind.Pattern:
		switch {
		case last == "name":
			return loc, loc, shown() + " is not a tool name: a lower-case letter, then up to 23 of a-z, 0-9 and _"
		case last == "timeout":
			return loc, loc, shown() + " is not a duration such as 10s or 1m"
		case last == "description":
			return loc, loc, "holds a control character (a tab or a line break may stay)"
		}
		return loc, loc, "holds a NUL or control character"
	case *kind.Type:
		if last == "command" {
			return loc, loc, "not a list: give the program and its arguments as a list, run without a shell"
		}
	case *kind.MinProperties:
		return loc, loc, "empty; give max_length, pattern or enum, or leave query out"
	}
	if msg, ok := yamlconf.Plain(e, shown()); ok {
		return loc, loc, msg
	}
	return loc, loc, "fails " + strings.Join(e.ErrorKind.KeywordPath(), "/") + " of " + schemas.AgentTools
}

// safetyWords say what each class lets a tool do.
var safetyWords = map[string]string{
	schemas.SafetyReadOnly:    "read_only: reads, changes nothing",
	schemas.SafetyMutating:    "mutating: changes the device's state",
	schemas.SafetyDestructive: "destructive: may destroy data or stop the device",
}

// Describe returns the local tools' seed-002 descriptors, in the file's
// order: for an operator to check a tools file (okso agent --describe).
// A registered kind's capabilities are left out: their descriptors are
// their kind's, which the agent does not have.
func Describe(tools []LocalTool) []action.Descriptor {
	out := make([]action.Descriptor, 0, len(tools))
	for _, t := range tools {
		if t.Kind != "" {
			continue
		}
		guard := []string{safetyWords[t.Safety], "runs at most " + t.Timeout.String() + ", then its process group is killed"}
		if t.Concurrency > 0 {
			guard = append(guard, fmt.Sprintf("at most %d at once", t.Concurrency))
		}
		if t.RateLimit > 0 {
			guard = append(guard, fmt.Sprintf("at most %g a second", t.RateLimit))
		}
		query := map[string]any{"type": "string", "maxLength": schemas.MaxLocalQuery,
			"description": "Passed to the tool as TOOL_QUERY in its environment."}
		if t.Query.HasMax {
			query["maxLength"] = t.Query.MaxLength
		}
		if t.Query.Pattern != nil {
			query["pattern"] = t.Query.Pattern.String()
		}
		if t.Query.Enum != nil {
			query["enum"] = t.Query.Enum
		}
		out = append(out, action.Descriptor{
			Name:        t.Name,
			Description: t.Announced(),
			Command:     shellLine(t.Command),
			Origin:      "local",
			Safety:      strings.Join(guard, "; "),
			InputSchema: mustJSON(map[string]any{"type": "object", "additionalProperties": false,
				"properties": map[string]any{"query": query}}),
			ResultSchema: mustJSON(map[string]any{
				"type": "object", "required": []string{"type", "tool", "result"},
				"properties": map[string]any{
					"type": map[string]any{"const": "result"},
					"tool": map[string]any{"const": t.Name},
					"result": map[string]any{
						"type": "object", "required": []string{"stdout", "exit_code", "truncated"},
						"properties": map[string]any{
							"stdout":    map[string]any{"type": "string"},
							"exit_code": map[string]any{"type": "integer"},
							"truncated": map[string]any{"type": "boolean"},
						},
					},
				},
			}),
		})
	}
	return out
}

// mustJSON encodes a schema written here (which always encodes).
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// shellLine writes argv as one line, each argument quoted as a POSIX
// shell would need it: for people to read, never run by okso.
func shellLine(argv []string) string {
	quoted := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-") == "" {
			quoted[i] = a
			continue
		}
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(quoted, " ")
}
