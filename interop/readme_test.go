package interop

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/roles"
)

// tokenPlaceholder stands for an agent token in the README's host
// snippets: the start of every token `okso token mint` prints (the
// base64url of `{"`), then an ellipsis.
const tokenPlaceholder = "eyJ..."

// snippetRe finds the README's host snippets: a marker comment naming
// the host, then one fenced block.
var snippetRe = regexp.MustCompile("(?s)<!-- host-config: ([a-z0-9-]+) -->\n```([a-z]+)\n(.*?)```")

// hostEntry is a snippet as its host reads it: a command it starts, or a
// URL it connects to with headers. It is host.mjs's server entry.
type hostEntry struct {
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// readmeHost is how one host reads its snippet: the fence's language,
// and the entry the host makes of the text.
type readmeHost struct {
	lang  string
	entry func(t *testing.T, body string) hostEntry
}

// readmeHosts are the hosts of the README's "Connect your agent host".
// Secrets a host asks for or reads from its environment (VS Code's
// inputs, Codex's bearer_token_env_var) become the placeholder.
func readmeHosts() map[string]readmeHost {
	return map[string]readmeHost{
		"claude-code-cli":      {"sh", claudeCodeCLI},
		"claude-code-mcp-json": {"json", jsonServer("mcpServers", "http")},
		"claude-desktop":       {"json", jsonServer("mcpServers", "")},
		"vscode":               {"json", vscode},
		"cursor":               {"json", jsonServer("mcpServers", "")},
		"codex-stdio":          {"toml", codex},
		"codex-http":           {"toml", codex},
	}
}

// TestReadmeHosts checks every host snippet of the README against okso as
// its host would use it: the JSON or TOML parses, the URL is the
// gateway's /mcp, the header is "Authorization: Bearer" with the token
// placeholder; then, with a running all-in-one's URL and a minted token
// in their place, the command snippets are started as their hosts start
// them (the TypeScript SDK's stdio client) and the URL snippets
// connected (its Streamable HTTP client), and each lists okso's tools.
func TestReadmeHosts(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := sectionOf(t, string(b), "## Connect your agent host")
	hosts := readmeHosts()
	found := map[string]hostEntry{}
	for _, m := range snippetRe.FindAllStringSubmatch(section, -1) {
		name, lang, body := m[1], m[2], m[3]
		h, ok := hosts[name]
		switch {
		case !ok:
			t.Errorf("README: a snippet for %q, a host this test does not know", name)
			continue
		case lang != h.lang:
			t.Errorf("README: the %s snippet is ```%s, want ```%s", name, lang, h.lang)
			continue
		}
		if _, dup := found[name]; dup {
			t.Errorf("README: two snippets for %s", name)
		}
		e := h.entry(t, body)
		checkEntry(t, name, e)
		found[name] = e
	}
	for name := range hosts {
		if _, ok := found[name]; !ok {
			t.Errorf("README: no snippet for %s (a marker <!-- host-config: %s --> before its block)", name, name)
		}
	}
	if t.Failed() {
		return
	}

	o := startOkso(t, 1)
	token := o.mint(t, auth.ScopeReadOnly)
	if !strings.HasPrefix(token, strings.TrimSuffix(tokenPlaceholder, "...")) {
		t.Fatalf("okso token mint printed %.12s..., which the README's placeholder %s does not stand for", token, tokenPlaceholder)
	}
	for name, e := range found {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := live(e, o.mcpURL, token)
			h, _ := startHost(t, e)
			names := h.list().names()
			if !slices.ContainsFunc(names, func(n string) bool { return isEcho(n, o.nodes[0]) }) {
				t.Errorf("connected as the README says, okso lists %v: no echo of node %s", names, o.nodes[0])
			}
			h.finish()
		})
	}
}

// isEcho tells the echo tool of node by its canonical name or its
// dot-free safe form (DESIGN.md §8, listed names).
func isEcho(name, node string) bool {
	return name == echoTool(node) || name == strings.ReplaceAll(echoTool(node), ".", "-")
}

// sectionOf is the part of the markdown doc from the heading to the next
// heading of its level.
func sectionOf(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README: no section %q", heading)
	}
	rest := doc[i+len(heading)+2:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// checkEntry checks what the README promises of every snippet: the
// gateway's MCP endpoint, and the token as a bearer token.
func checkEntry(t *testing.T, name string, e hostEntry) {
	t.Helper()
	endpoint := e.URL
	if e.Command != "" {
		if base := path.Base(e.Command); base != "okso" {
			t.Errorf("%s: starts %q, not okso", name, e.Command)
		}
		i := slices.Index(e.Args, "--url")
		if len(e.Args) == 0 || e.Args[0] != "stdio" || i < 0 || i+1 >= len(e.Args) {
			t.Errorf("%s: args %q, want stdio --url URL", name, e.Args)
			return
		}
		endpoint = e.Args[i+1]
		if tok := e.Env["OKSO_TOKEN"]; tok != tokenPlaceholder {
			t.Errorf("%s: env OKSO_TOKEN is %q, want the token placeholder %s", name, tok, tokenPlaceholder)
		}
	} else if h := e.Headers["Authorization"]; h != "Bearer "+tokenPlaceholder || len(e.Headers) != 1 {
		t.Errorf("%s: headers %v, want only Authorization: Bearer %s", name, e.Headers, tokenPlaceholder)
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "http" || u.Host != roles.DefaultMCPAddr || u.Path != "/mcp" || u.RawQuery != "" {
		t.Errorf("%s: URL %q, want the gateway's MCP endpoint http://%s/mcp", name, endpoint, roles.DefaultMCPAddr)
	}
}

// live is the entry with the test's gateway and token in place of the
// README's, and the okso under test as the command.
func live(e hostEntry, mcpURL, token string) hostEntry {
	out := hostEntry{URL: e.URL, Args: slices.Clone(e.Args), Env: map[string]string{}, Headers: map[string]string{}}
	if out.URL != "" {
		out.URL = mcpURL
	}
	if e.Command != "" {
		out.Command = binary
	}
	for i, a := range out.Args {
		if strings.HasPrefix(a, "http://") {
			out.Args[i] = mcpURL
		}
	}
	for k, v := range e.Env {
		out.Env[k] = strings.ReplaceAll(v, tokenPlaceholder, token)
	}
	for k, v := range e.Headers {
		out.Headers[k] = strings.ReplaceAll(v, tokenPlaceholder, token)
	}
	return out
}

// claudeCodeCLI reads `claude mcp add --transport http NAME URL --header
// "K: V"` as Claude Code's CLI does.
func claudeCodeCLI(t *testing.T, body string) hostEntry {
	t.Helper()
	words := shellWords(t, strings.TrimSpace(body))
	if len(words) < 3 || !slices.Equal(words[:3], []string{"claude", "mcp", "add"}) {
		t.Errorf("claude-code-cli: %q is not claude mcp add", body)
		return hostEntry{}
	}
	e := hostEntry{Headers: map[string]string{}}
	var pos []string
	for i := 3; i < len(words); i++ {
		switch w := words[i]; w {
		case "--transport", "--header":
			if i+1 >= len(words) {
				t.Errorf("claude-code-cli: %s without a value", w)
				return e
			}
			i++
			if w == "--transport" && words[i] != "http" {
				t.Errorf("claude-code-cli: --transport %s, want http", words[i])
			}
			if w == "--header" {
				k, v, ok := strings.Cut(words[i], ":")
				if !ok {
					t.Errorf("claude-code-cli: --header %q is not Name: Value", words[i])
				}
				e.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
			}
		default:
			pos = append(pos, w)
		}
	}
	if len(pos) != 2 || pos[0] != "okso" {
		t.Errorf("claude-code-cli: want the name okso and the URL, got %q", pos)
		return e
	}
	e.URL = pos[1]
	return e
}

// shellWords splits a one-line sh command with double quotes, as a shell
// would for these snippets (no escapes, no variables).
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case r == '\\' || r == '$' || r == '\'' || r == '\n':
			t.Fatalf("shellWords: %q has %q, which this reader does not read as sh does", s, r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("shellWords: unclosed quote in %q", s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// jsonServer reads the server okso of a JSON config whose servers are
// under key; wantType, if set, is the "type" the entry must carry.
func jsonServer(key, wantType string) func(t *testing.T, body string) hostEntry {
	return func(t *testing.T, body string) hostEntry {
		t.Helper()
		var top map[string]json.RawMessage
		if err := strictJSON(body, &top); err != nil {
			t.Errorf("JSON: %v", err)
			return hostEntry{}
		}
		var servers map[string]struct {
			hostEntry
			Type string `json:"type"`
		}
		if err := strictJSON(string(top[key]), &servers); err != nil {
			t.Errorf("%s: %v", key, err)
			return hostEntry{}
		}
		s, ok := servers["okso"]
		if !ok {
			t.Errorf("no %s.okso", key)
		}
		if s.Type != wantType {
			t.Errorf("%s.okso.type is %q, want %q", key, s.Type, wantType)
		}
		return s.hostEntry
	}
}

// vscode reads .vscode/mcp.json: servers.okso, whose ${input:ID} the
// user answers when VS Code asks (a promptString input kept as a secret).
func vscode(t *testing.T, body string) hostEntry {
	t.Helper()
	e := jsonServer("servers", "http")(t, body)
	var doc struct {
		Inputs []struct {
			Type        string `json:"type"`
			ID          string `json:"id"`
			Description string `json:"description"`
			Password    bool   `json:"password"`
		} `json:"inputs"`
		Servers json.RawMessage `json:"servers"`
	}
	if err := strictJSON(body, &doc); err != nil {
		t.Errorf("vscode: %v", err)
		return e
	}
	for k, v := range e.Headers {
		for _, in := range doc.Inputs {
			ref := "${input:" + in.ID + "}"
			if !strings.Contains(v, ref) {
				continue
			}
			if in.Type != "promptString" || !in.Password {
				t.Errorf("vscode: input %s is %s (password %v), want a promptString kept as a secret", in.ID, in.Type, in.Password)
			}
			e.Headers[k] = strings.ReplaceAll(v, ref, tokenPlaceholder)
		}
		if strings.Contains(e.Headers[k], "${") {
			t.Errorf("vscode: header %s %q names an input the file does not declare", k, v)
		}
	}
	return e
}

// codex reads ~/.codex/config.toml's [mcp_servers.okso]: a command, or a
// url whose bearer token Codex reads from the variable bearer_token_env_var
// names (here the placeholder stands for its value).
func codex(t *testing.T, body string) hostEntry {
	t.Helper()
	var doc struct {
		MCPServers map[string]struct {
			Command           string            `toml:"command"`
			Args              []string          `toml:"args"`
			Env               map[string]string `toml:"env"`
			URL               string            `toml:"url"`
			BearerTokenEnvVar string            `toml:"bearer_token_env_var"`
		} `toml:"mcp_servers"`
	}
	md, err := toml.Decode(body, &doc)
	if err != nil {
		t.Errorf("codex TOML: %v", err)
		return hostEntry{}
	}
	if un := md.Undecoded(); len(un) > 0 {
		t.Errorf("codex TOML: keys this test does not read as Codex does: %v", un)
	}
	s, ok := doc.MCPServers["okso"]
	if !ok {
		t.Error("codex: no [mcp_servers.okso]")
		return hostEntry{}
	}
	e := hostEntry{Command: s.Command, Args: s.Args, Env: s.Env, URL: s.URL}
	if s.URL != "" {
		if s.Command != "" {
			t.Error("codex: both command and url")
		}
		if s.BearerTokenEnvVar == "" {
			t.Error("codex: a url without bearer_token_env_var")
		}
		e.Headers = map[string]string{"Authorization": "Bearer " + tokenPlaceholder}
	}
	return e
}

// strictJSON decodes a config snippet, refusing members v does not have
// (a misspelt key is a config its host ignores).
func strictJSON(body string, v any) error {
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("more than one JSON document")
	}
	return nil
}
