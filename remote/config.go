package remote

import (
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"

	"github.com/okso-io/okso/internal/yamlconf"
	"github.com/okso-io/okso/schemas"
)

// configSchema is the $id of the config's contract.
const configSchema = schemas.IDPrefix + "remotes.config@1.0.0"

// The limits and defaults of DESIGN.md §9.1 that the schema cannot state.
const (
	defaultTimeout = 10 * time.Second
	defaultRefresh = 60 * time.Second
	maxTimeout     = 5 * time.Minute
	minRefresh     = time.Second
)

// MCP_ENDPOINT (seed 002) adds one action upstream of this name.
const (
	envEndpoint  = "MCP_ENDPOINT"
	endpointName = "endpoint"
)

// Config is the remote tier's configuration: the upstreams it federates,
// in the order the file lists them, then the MCP_ENDPOINT one if any.
type Config struct{ Upstreams []Upstream }

// Upstream is one federated upstream, checked: every field has its
// transport's meaning, globs are valid, and every tool that Allowed
// accepts has a safety class. Its methods are safe for concurrent use as
// long as nobody modifies it.
type Upstream struct {
	Name       string
	Transport  string            // "stdio" | "http" | "action"
	Command    []string          // stdio, action
	URL        string            // http
	Headers    map[string]string // http; ${VAR} already expanded
	Env        map[string]string // stdio, action: the child's environment besides PATH and HOME
	Tenants    []string          // "*" = every tenant
	Allow      []string          // names or path.Match globs; deny by default
	Safety     map[string]string // tool name or glob -> read_only | mutating | destructive
	Idempotent []string          // names or globs
	Timeout    time.Duration     // per call (default 10s)
	Refresh    time.Duration     // periodic re-list (default 60s)
}

// Load reads the config file at path and checks it as [Parse] does. An
// empty path means no file: the config then holds only the upstream
// MCP_ENDPOINT adds, or none.
func Load(path string, getenv func(string) (string, bool)) (*Config, error) {
	if path == "" {
		c := &Config{}
		if u, ok := endpoint(getenv); ok {
			c.Upstreams = append(c.Upstreams, u)
		}
		return c, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read remote config: %w", err)
	}
	return Parse(data, path, getenv)
}

// loadSchemas compiles the embedded schemas once: a set is read-only,
// and compiling every schema costs tens of milliseconds, which a reload,
// or a fuzzer calling Parse thousands of times, would pay each time.
var loadSchemas = sync.OnceValues(schemas.Load)

// Parse checks a config file's contents against remotes.config@1.0.0, then
// what the schema cannot say: unique names, durations within bounds,
// ${VAR} in header values (from getenv; nil is an empty environment),
// valid globs, and a safety class for every allowed tool, since an
// upstream's own hints are never trusted. Defaults fill what the file
// leaves out. getenv("MCP_ENDPOINT"), when it holds a command, adds the
// upstream endpoint (transport action, every tenant, every tool it lists
// allowed as mutating).
//
// An error is one line naming the file (name), the line and the field, as
// in `remotes.yaml:7: upstreams[1].transport: "ftp" is not one of stdio,
// http, action`; a few YAML syntax errors have no line, and a file that
// is empty or expands too far has neither. It may quote what the file
// says, but never a url, a header's or an environment variable's value.
func Parse(data []byte, name string, getenv func(string) (string, bool)) (*Config, error) {
	if getenv == nil {
		getenv = func(string) (string, bool) { return "", false }
	}
	set, err := loadSchemas()
	if err != nil {
		return nil, fmt.Errorf("load the config schema: %w", err)
	}
	f := form()
	root, v, err := f.Checked(data, name, configSchema, func(v any) error { return set.Validate(configSchema, v) })
	if err != nil {
		return nil, err
	}
	c := &Config{}
	ends, endsOK := endpoint(getenv)
	seen := map[string]int{} // name -> index
	items, _ := v.(map[string]any)["upstreams"].([]any)
	for i, item := range items {
		m := item.(map[string]any)
		un := m["name"].(string)
		at := []string{"upstreams", strconv.Itoa(i), "name"}
		if j, dup := seen[un]; dup {
			first := []string{"upstreams", strconv.Itoa(j), "name"}
			return nil, errAt(name, root, at, "%s is already the name of upstreams[%d] (line %d)", quote(un), j, lineOf(root, first))
		}
		seen[un] = i
		if endsOK && un == endpointName {
			return nil, errAt(name, root, at, "%q is the upstream %s adds; rename this one or unset %s", endpointName, envEndpoint, envEndpoint)
		}
		u, err := build(name, root, i, m, getenv)
		if err != nil {
			return nil, err
		}
		c.Upstreams = append(c.Upstreams, u)
	}
	if endsOK {
		c.Upstreams = append(c.Upstreams, ends)
	}
	return c, nil
}

// endpoint returns the upstream MCP_ENDPOINT adds: its value split on
// spaces (no shell runs it), or nothing when it is unset or blank.
func endpoint(getenv func(string) (string, bool)) (Upstream, bool) {
	if getenv == nil {
		return Upstream{}, false
	}
	v, _ := getenv(envEndpoint)
	command := strings.Fields(v)
	if len(command) == 0 {
		return Upstream{}, false
	}
	return Upstream{
		Name:      endpointName,
		Transport: "action",
		Command:   command,
		Tenants:   []string{"*"},
		Allow:     []string{"*"},
		Safety:    map[string]string{"*": "mutating"},
		Timeout:   defaultTimeout,
		Refresh:   defaultRefresh,
	}, true
}

// Allowed reports whether the upstream federates the tool: its name is in
// Allow or matches one of its globs ("*" matches every name).
func (u *Upstream) Allowed(tool string) bool {
	return tool != "" && matchAny(u.Allow, tool)
}

// SafetyOf returns the safety class of the tool: the Safety entry of its
// exact name, else that of the longest glob that matches it (of two as
// long, the one that sorts first), else that of "*". It returns "" only
// for a tool that Allowed refuses, as Parse makes sure.
func (u *Upstream) SafetyOf(tool string) string {
	if c, ok := u.Safety[tool]; ok {
		return c
	}
	best := ""
	for k := range u.Safety {
		if k == "*" || !isGlob(k) || !match(k, tool) {
			continue
		}
		if len(k) > len(best) || len(k) == len(best) && k < best {
			best = k
		}
	}
	if best != "" {
		return u.Safety[best]
	}
	return u.Safety["*"]
}

// IsIdempotent reports whether calls of the tool may be retried after a
// transient failure: its name is in Idempotent or matches one of its globs.
func (u *Upstream) IsIdempotent(tool string) bool {
	return tool != "" && matchAny(u.Idempotent, tool)
}

func matchAny(patterns []string, tool string) bool {
	for _, p := range patterns {
		if p == tool || isGlob(p) && match(p, tool) {
			return true
		}
	}
	return false
}

// match is path.Match for a checked pattern, except that "*" matches every
// name, "/" included.
func match(pattern, name string) bool {
	if pattern == "*" {
		return true
	}
	ok, _ := path.Match(pattern, name)
	return ok
}

// isGlob reports whether p uses path.Match's syntax; a name without it
// matches only itself.
func isGlob(p string) bool { return strings.ContainsAny(p, `*?[\`) }

// build makes upstream i of a document the schema accepted, and checks
// what the schema cannot.
func build(file string, root *yaml.Node, i int, m map[string]any, getenv func(string) (string, bool)) (Upstream, error) {
	at := func(field ...string) []string { return append([]string{"upstreams", strconv.Itoa(i)}, field...) }
	u := Upstream{
		Name:       m["name"].(string),
		Transport:  m["transport"].(string),
		Command:    strs(m["command"]),
		URL:        str(m["url"]),
		Headers:    strMap(m["headers"]),
		Env:        strMap(m["env"]),
		Tenants:    strs(m["tenants"]),
		Allow:      strs(m["allow"]),
		Safety:     strMap(m["safety"]),
		Idempotent: strs(m["idempotent"]),
		Timeout:    defaultTimeout,
		Refresh:    defaultRefresh,
	}
	for _, d := range []struct {
		key      string
		into     *time.Duration
		min, max time.Duration // 0: none
	}{
		{"timeout", &u.Timeout, 0, maxTimeout},
		{"refresh", &u.Refresh, minRefresh, 0},
	} {
		s, ok := m[d.key].(string)
		if !ok {
			continue
		}
		v, err := time.ParseDuration(s)
		switch {
		case err != nil:
			return u, errAt(file, root, at(d.key), "%s is out of range", quote(s))
		case v <= 0:
			return u, errAt(file, root, at(d.key), "%s is not above 0", quote(s))
		case v < d.min:
			return u, errAt(file, root, at(d.key), "%s is below %v", quote(s), d.min)
		case d.max > 0 && v > d.max:
			return u, errAt(file, root, at(d.key), "%s is above %v", quote(s), d.max)
		}
		*d.into = v
	}
	for _, k := range keysByLine(root, at("headers")) {
		v, err := expand(u.Headers[k], getenv)
		if err != nil {
			return u, errAt(file, root, at("headers", k), "%v", err)
		}
		u.Headers[k] = v
	}
	for j, p := range u.Allow {
		if _, err := path.Match(p, ""); err != nil {
			return u, errAt(file, root, at("allow", strconv.Itoa(j)), "%s is not a valid glob (path.Match syntax)", quote(p))
		}
	}
	for _, p := range keysByLine(root, at("safety")) {
		if _, err := path.Match(p, ""); err != nil {
			return u, errAt(file, root, at("safety", p), "%s is not a valid glob (path.Match syntax)", quote(p))
		}
	}
	for j, p := range u.Idempotent {
		if _, err := path.Match(p, ""); err != nil {
			return u, errAt(file, root, at("idempotent", strconv.Itoa(j)), "%s is not a valid glob (path.Match syntax)", quote(p))
		}
	}
	for j, p := range u.Allow {
		if !classed(u.Safety, p) {
			return u, errAt(file, root, at("allow", strconv.Itoa(j)),
				"allows %s, which no safety entry classes (an upstream's own hints are not trusted); add safety: {%s: read_only} or a \"*\" entry",
				yamlName(p), yamlName(p))
		}
	}
	return u, nil
}

// classed reports whether every tool the allow entry p admits has a
// class: a safety entry for p itself or "*", or, when p is a plain name,
// any entry that matches it. A glob is covered only by an entry of the
// same glob or "*": whether one glob covers another is not worth guessing.
func classed(safety map[string]string, p string) bool {
	if _, ok := safety[p]; ok {
		return true
	}
	if _, ok := safety["*"]; ok {
		return true
	}
	if isGlob(p) {
		return false
	}
	for k := range safety {
		if isGlob(k) && match(k, p) {
			return true
		}
	}
	return false
}

// varName is a ${NAME} reference's NAME.
var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expand replaces ${NAME} in a header value with the variable NAME, which
// must be set, and $$ with $. Any other $ is an error, so a value written
// for a shell ($NAME) does not go out as it stands.
func expand(s string, getenv func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		s = s[i:]
		if strings.HasPrefix(s, "$$") {
			b.WriteByte('$')
			s = s[2:]
			continue
		}
		end := strings.IndexByte(s, '}')
		if !strings.HasPrefix(s, "${") || end < 0 {
			return "", errors.New(`a "$" begins ${NAME} or is written $$`)
		}
		name := s[2:end]
		if !varName.MatchString(name) {
			return "", fmt.Errorf("${%s} names no variable: want ${NAME} with NAME of A-Z, a-z, 0-9 and _", printable(name))
		}
		v, ok := getenv(name)
		if !ok {
			return "", fmt.Errorf("${%s} is not set in the environment", name)
		}
		if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 && r != '\t' || r == 0x7f }) {
			return "", fmt.Errorf("${%s} holds a control character, which a header cannot carry", name)
		}
		b.WriteString(v)
		s = s[end+1:]
	}
}

func str(v any) string { s, _ := v.(string); return s }

func strs(v any) []string {
	l, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = s.(string)
	}
	return out
}

func strMap(v any) map[string]string {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, s := range m {
		out[k] = s.(string)
	}
	return out
}

// --- YAML, kept as a tree so that errors can name lines (internal/yamlconf) ---

// form is the remote config's kind of file.
func form() *yamlconf.Form {
	return &yamlconf.Form{Empty: "want upstreams: followed by a list", IsIndex: isIndex, Describe: describe}
}

func lineOf(root *yaml.Node, loc []string) int          { return yamlconf.LineOf(root, loc) }
func keysByLine(root *yaml.Node, loc []string) []string { return yamlconf.KeysByLine(root, loc) }
func valueAt(doc any, loc []string) any                 { return yamlconf.ValueAt(doc, loc) }
func quote(s string) string                             { return yamlconf.Quote(s) }
func printable(s string) string                         { return yamlconf.Printable(s) }

func errAt(file string, root *yaml.Node, loc []string, format string, args ...any) error {
	return form().ErrAt(file, root, loc, format, args...)
}

// isIndex reports whether loc[i] indexes a list: in this config, the
// items of upstreams and of an upstream's list fields.
func isIndex(loc []string, i int) bool {
	if _, err := strconv.Atoi(loc[i]); err != nil {
		return false
	}
	switch loc[i-1] {
	case "upstreams":
		return i == 1
	case "command", "tenants", "allow", "idempotent":
		return i == 3
	}
	return false
}

// yamlName writes a tool name as a YAML flow mapping key: bare when it
// can be, quoted otherwise.
func yamlName(s string) string {
	if yamlconf.PlainKey(s) {
		return s
	}
	return quote(s)
}

// upstreamKeys are an upstream's keys, in the schema's order.
const upstreamKeys = "name, transport, command, env, url, headers, tenants, allow, safety, idempotent, timeout, refresh"

// describe words one broken rule: the location to name, the location
// whose line to give (the object, for a key that is missing) and what is
// wrong, in the operator's terms. It quotes what the file says except
// under env and headers, whose values may be secrets.
func describe(root *yaml.Node, doc any, e *jsonschema.ValidationError) (field, at []string, msg string) {
	loc := e.InstanceLocation
	secret := len(loc) >= 3 && loc[0] == "upstreams" && (loc[2] == "env" || loc[2] == "headers" || loc[2] == "url")
	shown := func() string { return yamlconf.Shown(valueAt(doc, loc), secret) }
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	switch k := e.ErrorKind.(type) {
	case *kind.AdditionalProperties:
		at := append(slices.Clone(loc), yamlconf.FirstByLine(root, loc, k.Properties))
		switch {
		case len(loc) == 0:
			return at, at, "unknown key; the file has only upstreams"
		case len(loc) == 2:
			return at, at, "unknown key; an upstream has " + upstreamKeys
		case last == "env":
			return at, at, "not an environment variable name (A-Z, a-z, 0-9 and _, not first a digit)"
		case last == "headers":
			return at, at, "not an HTTP header name"
		case last == "safety":
			return at, at, "not a tool name or glob (empty, or a control character)"
		}
		return at, at, "unknown key"
	case *kind.Required:
		missing := k.Missing[0]
		at := append(slices.Clone(loc), missing)
		transport, _ := valueAt(doc, append(slices.Clone(loc), "transport")).(string)
		switch missing {
		case "upstreams":
			return at, loc, "missing; the file lists its upstreams under upstreams:"
		case "allow":
			return at, loc, "missing; deny by default: an upstream federates only the tools its allow list names"
		case "command":
			return at, loc, "missing; transport " + transport + " runs a command"
		case "url":
			return at, loc, "missing; transport http needs the server's url"
		}
		return at, loc, "missing"
	case *kind.FalseSchema:
		var transport string
		if len(loc) >= 2 {
			transport, _ = valueAt(doc, append(slices.Clone(loc[:2]), "transport")).(string)
		}
		if last == "url" || last == "headers" {
			return loc, loc, "not for transport " + transport + "; url and headers are for http"
		}
		return loc, loc, "not for transport " + transport + "; command and env are for stdio and action"
	case *kind.Not:
		if strings.HasSuffix(e.SchemaURL, "/$defs/upstream_name") {
			return loc, loc, shown() + " is reserved for okso's own tools (fleet, okso, caller) and device kinds (sysecho, sys, gpio, local)"
		}
		return loc, loc, shown() + " is not allowed here"
	case *kind.Pattern:
		switch {
		case strings.HasSuffix(e.SchemaURL, "/$defs/upstream_name"):
			return loc, loc, shown() + " is not an upstream name: a lower-case letter, then up to 15 of a-z, 0-9 and _"
		case strings.HasSuffix(e.SchemaURL, "/$defs/duration"):
			return loc, loc, shown() + " is not a duration such as 10s, 1m30s or 500ms"
		case strings.HasSuffix(e.SchemaURL, "/$defs/tool_pattern"):
			return loc, loc, "empty, or holds a control character; want a tool name or glob"
		case len(loc) == 4 && loc[2] == "tenants":
			return loc, loc, shown() + ` is not a tenant (1 to 64 of A-Z, a-z, 0-9, _ and -) nor "*"`
		case last == "url":
			return loc, loc, "not an http:// or https:// URL"
		case len(loc) == 4 && loc[2] == "headers":
			return loc, loc, "holds a control character, which a header cannot carry"
		}
		return loc, loc, "holds a NUL character"
	case *kind.MinItems:
		switch last {
		case "allow":
			return loc, loc, "empty; deny by default: list the tools to federate"
		case "tenants":
			return loc, loc, `empty; list the tenants that see these tools, or "*" for every tenant`
		case "command":
			return loc, loc, "empty; name the program to run"
		}
		return loc, loc, fmt.Sprintf("fewer than %d items", k.Want)
	}
	if msg, ok := yamlconf.Plain(e, shown()); ok {
		return loc, loc, msg
	}
	return loc, loc, "fails " + strings.Join(e.ErrorKind.KeywordPath(), "/") + " of " + configSchema
}
