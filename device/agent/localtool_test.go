package agent_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// The local tools here are real processes: sh, with the query read from
// TOOL_QUERY (a shell expands a variable inside double quotes once, and
// never runs what it holds).
const toolsFile = `tools:
  - name: hello
    description: Says hello to the query.
    command: [sh, -c, 'printf "hello %s" "$TOOL_QUERY"']
    safety: read_only
  - name: echo_query
    description: Prints the query as it came.
    command: [sh, -c, 'printf %s "$TOOL_QUERY"']
    safety: read_only
  - name: fail3
    description: Exits 3 after a word.
    command: [sh, -c, 'echo failing; echo "to stderr" >&2; exit 3']
    safety: mutating
  - name: slow
    description: Starts a sleeper of its own, then waits for it.
    command: [sh, -c, 'sleep 60 & echo $! > "$PIDFILE"; wait']
    safety: read_only
    timeout: 300ms
    env: {PIDFILE: PIDFILE_PATH}
  - name: flood
    description: Writes a megabyte and more.
    command: [sh, -c, 'yes é | head -c 1100000']
    safety: read_only
  - name: missing
    description: A program that is not there.
    command: [/nonexistent/okso-tool]
    safety: read_only
  - name: count
    description: Tail a log.
    command: [sh, -c, 'printf %s "$TOOL_QUERY"']
    safety: read_only
    query: {pattern: '[0-9]{1,3}', max_length: 3}
  - name: unit
    description: A unit's status.
    command: [sh, -c, 'printf %s "$TOOL_QUERY"']
    safety: read_only
    query: {enum: [camera, sensor]}
`

// localDevice runs a device with the tools of toolsFile against a
// hand-written tier that offers local_tools, and returns the tier's end
// after announce_ok, with the announced manifest.
func localDevice(t *testing.T) (tc *tierConn, node string, announced wire.Announce, pidFile string) {
	t.Helper()
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	pidFile = filepath.Join(t.TempDir(), "pid")
	tools, err := agent.ParseTools([]byte(strings.Replace(toolsFile, "PIDFILE_PATH", strconv.Quote(pidFile), 1)), "tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	node = wire.NewNodeID()
	rt := newRawTier(t, set)
	o := agent.MockOptions(node, set, 1)
	o.URLs, o.Token = []string{rt.url}, "token"
	o.Logger = testLogger(t)
	if o, err = agent.WithLocalTools(o, tools); err != nil {
		t.Fatal(err)
	}
	runStandalone(t, o)
	tc = rt.accept(t)
	tc.c.SetReadLimit(1 << 20) // to see a frame too large, should one come
	tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
	tc.recv(t, wire.TypeAuth, nil)
	tc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
		ServerTimeMs: time.Now().UnixMilli(), Features: []string{wire.FeatureDeadlineAt, wire.FeatureLocalTools}})
	e := tc.recv(t, wire.TypeAnnounce, &announced)
	if err := set.ValidateJSON(schemas.Manifest, e.Payload); err != nil {
		t.Fatalf("the announce fails the manifest schema: %v", err)
	}
	projected, err := schemas.Project(node, announced.Capabilities)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range projected {
		names = append(names, p.Name)
	}
	tc.send(t, wire.TypeAnnounceOK, e.MsgID, wire.AnnounceOK{Tools: names})
	return tc, node, announced, pidFile
}

// run sends a cmd for a local tool and returns its cmd_ack and frame.
func run(t *testing.T, tc *tierConn, node, tool, args string) (wire.CmdAck, int) {
	t.Helper()
	id := wire.NewMsgID()
	b, err := wire.EncodeID(wire.TypeCmd, id, "", wire.Cmd{Tool: "local." + node + "." + tool + ".run",
		Arguments: json.RawMessage(args), DeadlineMs: int(waitFor / time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	tc.sendRaw(t, b)
	var ack wire.CmdAck
	e := tc.recv(t, wire.TypeCmdAck, &ack)
	if e.InReplyTo != id {
		t.Fatalf("cmd_ack in reply to %s, want %s", e.InReplyTo, id)
	}
	frame, _ := wire.EncodeID(wire.TypeCmdAck, e.MsgID, e.InReplyTo, ack)
	return ack, len(frame)
}

func result(t *testing.T, ack wire.CmdAck) agent.LocalResult {
	t.Helper()
	if !ack.OK || ack.Error != nil {
		t.Fatalf("cmd_ack %+v, want a result", ack)
	}
	var r agent.LocalResult
	if err := json.Unmarshal(ack.Result, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func wantError(t *testing.T, ack wire.CmdAck, code string) {
	t.Helper()
	if ack.OK || ack.Error == nil || ack.Error.Code != code {
		t.Fatalf("cmd_ack %+v, want %s", ack, code)
	}
}

// TestLocalTools runs real local tools through the agent: a result on
// exit 0 and on exit 3, the query received exactly, a run past its
// timeout killed with what it started, a megabyte cut to fit the frame,
// a program that is not there, and queries outside a tool's rule refused
// before anything runs.
func TestLocalTools(t *testing.T) {
	tc, node, announced, pidFile := localDevice(t)
	set, _ := schemas.Load()

	var hello *schemas.Capability
	for i, c := range announced.Capabilities {
		if c.CapID == "hello" {
			hello = &announced.Capabilities[i]
		}
	}
	if hello == nil || hello.Kind != schemas.KindLocal || hello.Description != "Says hello to the query." ||
		hello.Constraints.DeadlineMsDefault != 10000 {
		t.Fatalf("announced %+v, want hello as a local tool with its description and a 10 s deadline", hello)
	}

	t.Run("exit 0", func(t *testing.T) {
		ack, _ := run(t, tc, node, "hello", `{"query":"world"}`)
		if err := set.ValidateJSON(schemas.LocalRun, ack.Result); err != nil {
			t.Errorf("result %s fails its schema: %v", ack.Result, err)
		}
		if r := result(t, ack); r != (agent.LocalResult{NodeID: node, Stdout: "hello world"}) {
			t.Errorf("result %+v", r)
		}
	})
	t.Run("exit 3", func(t *testing.T) {
		if r := result(t, ack1(t, tc, node, "fail3", `{}`)); r.ExitCode != 3 || r.Stdout != "failing\n" || r.Truncated {
			t.Errorf("result %+v, want exit 3 and its stdout alone", r)
		}
	})
	t.Run("TOOL_QUERY exactly", func(t *testing.T) {
		for _, q := range []string{"", `say "hi" & 'bye' $(rm -rf /) ; \`, "two\nlines\ttab", "é€😀", strings.Repeat("q", 4096)} {
			args, _ := json.Marshal(map[string]string{"query": q})
			if r := result(t, ack1(t, tc, node, "echo_query", string(args))); r.Stdout != q || r.ExitCode != 0 {
				t.Errorf("query %q came back as %q", q, r.Stdout)
			}
		}
		args, _ := json.Marshal(map[string]string{"query": strings.Repeat("é", 2049)}) // 4098 bytes
		wantError(t, ack1(t, tc, node, "echo_query", string(args)), schemas.CodeManifestInvalid)
	})
	t.Run("past its timeout", func(t *testing.T) {
		wantError(t, ack1(t, tc, node, "slow", `{}`), schemas.CodeDeadlineExceeded)
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		// SIGKILL went to the whole group before the call ended; the
		// sleeper, an orphan now, dies as the kernel gets to it: its pidfd
		// says when.
		waitGone(t, pid)
	})
	t.Run("a megabyte", func(t *testing.T) {
		ack, frame := run(t, tc, node, "flood", `{}`)
		r := result(t, ack)
		if !r.Truncated || r.ExitCode != 0 || !utf8.ValidString(r.Stdout) || len(r.Stdout) < 30000 {
			t.Errorf("result of %d bytes of stdout, truncated %v, exit %d", len(r.Stdout), r.Truncated, r.ExitCode)
		}
		if frame > 65536 {
			t.Errorf("cmd_ack of %d bytes, above the tier's 65536", frame)
		}
		if strings.Trim(r.Stdout, "é\n") != "" {
			t.Errorf("stdout not cut on a character: %q", r.Stdout[max(0, len(r.Stdout)-8):])
		}
	})
	t.Run("missing program", func(t *testing.T) {
		wantError(t, ack1(t, tc, node, "missing", `{}`), schemas.CodeInternal)
	})
	t.Run("query rules", func(t *testing.T) {
		for tool, q := range map[string]string{"count": "1234", "unit": "shell"} {
			args, _ := json.Marshal(map[string]string{"query": q})
			wantError(t, ack1(t, tc, node, tool, string(args)), schemas.CodeManifestInvalid)
		}
		for _, q := range []string{"12x", "a"} {
			args, _ := json.Marshal(map[string]string{"query": q})
			wantError(t, ack1(t, tc, node, "count", string(args)), schemas.CodeManifestInvalid)
		}
		wantError(t, ack1(t, tc, node, "unit", `{}`), schemas.CodeManifestInvalid) // no query: ""
		if r := result(t, ack1(t, tc, node, "count", `{"query":"50"}`)); r.Stdout != "50" {
			t.Errorf("count 50: %+v", r)
		}
		if r := result(t, ack1(t, tc, node, "unit", `{"query":"camera"}`)); r.Stdout != "camera" {
			t.Errorf("unit camera: %+v", r)
		}
		wantError(t, ack1(t, tc, node, "hello", `{"query":"x","cmd":"rm"}`), schemas.CodeManifestInvalid)
	})
	for _, c := range announced.Capabilities {
		if c.CapID == "count" && !strings.Contains(c.Description, "query: matching the regular expression [0-9]{1,3}; at most 3 bytes.") {
			t.Errorf("count's description %q does not state its query's rule", c.Description)
		}
	}
}

func ack1(t *testing.T, tc *tierConn, node, tool, args string) wire.CmdAck {
	t.Helper()
	ack, _ := run(t, tc, node, tool, args)
	return ack
}

// TestLocalToolsOlderTier: a tier that does not offer local_tools gets the
// device's other capabilities, not its local tools (it would refuse the
// whole manifest).
func TestLocalToolsOlderTier(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	tools, err := agent.ParseTools([]byte(toolsFile), "tools.yaml")
	if err != nil {
		t.Fatal(err)
	}
	node := wire.NewNodeID()
	rt := newRawTier(t, set)
	o := agent.MockOptions(node, set, 1)
	o.URLs, o.Token = []string{rt.url}, "token"
	if o, err = agent.WithLocalTools(o, tools); err != nil {
		t.Fatal(err)
	}
	runStandalone(t, o)
	tc := rt.accept(t)
	tc.send(t, wire.TypeHello, "", wire.Hello{Proto: wire.Subprotocol, AuthDeadlineMs: 5000, MaxFrameBytes: 65536})
	tc.recv(t, wire.TypeAuth, nil)
	tc.send(t, wire.TypeAuthOK, "", wire.AuthOK{NodeID: node, Tenant: tenant, SessionID: wire.NewMsgID(),
		ServerTimeMs: time.Now().UnixMilli(), Features: []string{wire.FeatureDeadlineAt, wire.FeatureLabels}})
	var announced wire.Announce
	tc.recv(t, wire.TypeAnnounce, &announced)
	if len(announced.Capabilities) == 0 {
		t.Fatal("nothing announced")
	}
	for _, c := range announced.Capabilities {
		if c.Kind == schemas.KindLocal {
			t.Errorf("announced the local tool %s to a tier without local_tools", c.CapID)
		}
	}
}

// TestParseTools: a tools file that is wrong is refused at start with
// its line and field named.
func TestParseTools(t *testing.T) {
	for name, tc := range map[string]struct{ file, want string }{
		"no safety": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n",
			"tools.yaml:2: tools[0].safety: missing; say what running it can do: read_only, mutating or destructive (there is no default)"},
		"a shell line": {"tools:\n  - name: x\n    description: d\n    safety: read_only\n    command: rm -rf /tmp/x\n",
			"tools.yaml:5: tools[0].command: not a list: give the program and its arguments as a list, run without a shell"},
		"unknown key": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: read_only\n    shell: true\n",
			"tools.yaml:6: tools[0].shell: unknown key; a tool has " + "name, description, command, safety, timeout, rate_limit_rps, max_concurrency, env, dir, query (and kind, verbs, schema_ref for a registered kind)"},
		"kind without verbs": {"tools:\n  - name: b\n    kind: acme.thermo\n    schema_ref: mcp://schemas/acme.thermo.read.input@1.0.0\n    command: [/bin/true]\n    safety: mutating\n",
			"tools.yaml:2: tools[0].verbs: missing; the verbs of the kind the command serves"},
		"kind with a description": {"tools:\n  - name: b\n    kind: acme.thermo\n    verbs: [read]\n    schema_ref: mcp://schemas/acme.thermo.read.input@1.0.0\n    description: d\n    command: [/bin/true]\n    safety: mutating\n",
			"tools.yaml:6: tools[0].description: not for a registered kind's capability (with kind): its kind's definition says what it does"},
		"verbs without kind": {"tools:\n  - name: x\n    description: d\n    verbs: [read]\n    command: [/bin/true]\n    safety: read_only\n",
			"tools.yaml:4: tools[0].verbs: only with kind: a registered kind's capability"},
		"a built-in kind": {"tools:\n  - name: b\n    kind: system.echo\n    verbs: [invoke]\n    schema_ref: mcp://schemas/system.echo.invoke.input@1.0.0\n    command: [/bin/true]\n    safety: read_only\n",
			`tools.yaml:3: tools[0].kind: "system.echo" is built in: leave kind out for a local tool`},
		"another kind's schema": {"tools:\n  - name: b\n    kind: acme.thermo\n    verbs: [read]\n    schema_ref: mcp://schemas/acme.other.read.input@1.0.0\n    command: [/bin/true]\n    safety: mutating\n",
			"tools.yaml:5: tools[0].schema_ref: not an input schema of kind acme.thermo (mcp://schemas/acme.thermo.<verb>.input@<version>)"},
		"bad class": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: harmless\n",
			`tools.yaml:5: tools[0].safety: "harmless" is not one of read_only, mutating, destructive`},
		"timeout too long": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: read_only\n    timeout: 2m\n",
			`tools.yaml:6: tools[0].timeout: "2m" is not a duration above 0 and at most 1m0s`},
		"same name": {"tools:\n  - {name: x, description: d, command: [a], safety: read_only}\n  - {name: x, description: d, command: [b], safety: read_only}\n",
			`tools.yaml:3: tools[1].name: "x" is already the name of tools[0]`},
		"bad pattern": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: read_only\n    query: {pattern: '(['}\n",
			"tools.yaml:6: tools[0].query.pattern: not a Go regular expression: error parsing regexp: missing closing ]: `[)$`"},
		"TOOL_QUERY set": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: read_only\n    env: {TOOL_QUERY: secret}\n",
			"tools.yaml:6: tools[0].env.TOOL_QUERY: TOOL_QUERY is the query's: the agent sets it"},
		"query too long": {"tools:\n  - name: x\n    description: d\n    command: [/bin/true]\n    safety: read_only\n    query: {max_length: 5000}\n",
			"tools.yaml:6: tools[0].query.max_length: 5000 is above 4096"},
		"name": {"tools:\n  - name: 9lives\n    description: d\n    command: [/bin/true]\n    safety: read_only\n",
			`tools.yaml:2: tools[0].name: "9lives" is not a tool name: a lower-case letter, then up to 23 of a-z, 0-9 and _`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := agent.ParseTools([]byte(tc.file), "tools.yaml")
			if err == nil || err.Error() != tc.want {
				t.Errorf("ParseTools:\n got %v\nwant %s", err, tc.want)
			}
		})
	}
}

// testLogger writes the device's log through t.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
