package interop

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// The tools of a simulated device (README, Capabilities).
func echoTool(node string) string      { return "sysecho." + node + ".echo.invoke" }
func snapshotTool(node string) string  { return "sys." + node + ".metrics.snapshot" }
func subscribeTool(node string) string { return "sys." + node + ".metrics.subscribe" }
func pinReadTool(node string) string   { return "gpio." + node + ".pin.read" }
func pinWriteTool(node string) string  { return "gpio." + node + ".pin.write" }

// listedName is how tools/list names a tool by default: its safe form
// (each dot a dash), which every agent host accepts. A call by either
// name works.
func listedName(canonical string) string { return schemas.SafeToolName(canonical) }

// oksoTools are the listed names of okso's own read-only tools, which
// every tenant lists to every token that may call read-only tools.
func oksoTools() []string {
	return []string{listedName(mcp.ToolFleetCall), listedName(mcp.ToolFleetNodes), listedName(mcp.ToolFindTools)}
}

// readOnlyToolsOf are the listed names of the tools that a token with
// only tools:call:read_only lists, sorted: those of nodes, and okso's
// own.
func readOnlyToolsOf(nodes []string) []string {
	names := oksoTools()
	for _, n := range nodes {
		names = append(names, readOnlyTools(n)...)
	}
	slices.Sort(names)
	return names
}

// readOnlyTools are the listed names of the tools of a node a token with
// only tools:call:read_only lists; a token that may mutate lists
// pin.write too.
func readOnlyTools(node string) []string {
	return []string{listedName(echoTool(node)), listedName(snapshotTool(node)), listedName(subscribeTool(node)), listedName(pinReadTool(node))}
}

// streamEnd bounds how long the gateway may take to end a stream its
// client cancelled or left. It is far below the stream's ping interval
// (25 s), which would otherwise be the first write to find a client gone.
const streamEnd = 5 * time.Second

// call is one tools/call of call.mjs.
type call struct {
	Name      string         `json:"name"`
	Arguments map[string]any `json:"arguments,omitempty"`
}

// listed is what list.mjs prints.
type listed struct {
	Pages []int `json:"pages"`
	Tools []struct {
		Name string         `json:"name"`
		Meta map[string]any `json:"_meta"`
	} `json:"tools"`
}

func (l listed) names() []string {
	var names []string
	for _, t := range l.Tools {
		names = append(names, t.Name)
	}
	return names
}

// called is what call.mjs prints.
type called struct {
	Pages    []int     `json:"pages"`
	Outcomes []outcome `json:"outcomes"`
}

// callTools runs call.mjs: it lists every tool (so the TypeScript client
// checks each structuredContent against its tool's outputSchema), then
// makes the calls, one after the other or all at once.
func callTools(t *testing.T, o *okso, token string, concurrent bool, calls ...call) []outcome {
	t.Helper()
	b, err := json.Marshal(calls)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{string(b)}
	if concurrent {
		args = append(args, "--concurrent")
	}
	var res called
	runScript(t, clientEnv(o.mcpURL, token), &res, "call.mjs", args...)
	if len(res.Pages) != 1 {
		// The client keeps the output schemas of the last page only.
		t.Fatalf("tools/list took %d pages: the client checked only the last one's output schemas", len(res.Pages))
	}
	if len(res.Outcomes) != len(calls) {
		t.Fatalf("call.mjs printed %d outcomes for %d calls", len(res.Outcomes), len(calls))
	}
	return res.Outcomes
}

// TestTypeScriptSDK drives okso with the official TypeScript SDK's Client
// over Streamable HTTP, as an application would, and checks what it sees
// against okso's contract (DESIGN §5, §8).
func TestTypeScriptSDK(t *testing.T) {
	o := startOkso(t, 4)
	n0, n1, n2, n3 := o.nodes[0], o.nodes[1], o.nodes[2], o.nodes[3]

	t.Run("initialize", func(t *testing.T) {
		t.Parallel()
		var init struct {
			ProtocolVersion string `json:"protocolVersion"`
			Capabilities    struct {
				Tools *struct {
					ListChanged bool `json:"listChanged"`
				} `json:"tools"`
			} `json:"capabilities"`
		}
		runScript(t, clientEnv(o.mcpURL, o.token), &init, "initialize.mjs")
		if init.ProtocolVersion != "2025-11-25" {
			t.Errorf("negotiated %q, want 2025-11-25 (the client's latest)", init.ProtocolVersion)
		}
		if init.Capabilities.Tools == nil {
			t.Fatal("initialize declares no tools capability")
		}
		if init.Capabilities.Tools.ListChanged {
			t.Error("a stateless server declares tools.listChanged on 2025-11-25, which it cannot deliver: " +
				"no session, no GET stream, nowhere to send notifications/tools/list_changed")
		}
	})

	t.Run("calls checked against output schemas", func(t *testing.T) {
		t.Parallel()
		out := callTools(t, o, o.token, false,
			call{echoTool(n0), map[string]any{"message": "ping"}},
			call{snapshotTool(n0), nil},
			call{pinReadTool(n0), nil})
		var echo struct {
			Message string `json:"message"`
			NodeID  string `json:"node_id"`
		}
		if wantResult(t, "echo", out[0], &echo) && (echo.Message != "ping" || echo.NodeID != n0) {
			t.Errorf("echo answered %+v, want ping from %s", echo, n0)
		}
		var sample struct {
			NodeID string `json:"node_id"`
		}
		if wantResult(t, "metrics snapshot", out[1], &sample) && sample.NodeID != n0 {
			t.Errorf("snapshot of node %s, want %s", sample.NodeID, n0)
		}
		var pin struct {
			NodeID string `json:"node_id"`
			Level  *int   `json:"level"`
		}
		if wantResult(t, "pin.read", out[2], &pin) && (pin.NodeID != n0 || pin.Level == nil) {
			t.Errorf("pin.read answered %+v", pin)
		}

		mutating := o.mint(t, auth.ScopeMutating, auth.ScopeReadOnly)
		out = callTools(t, o, mutating, false, call{pinWriteTool(n0), map[string]any{"level": 1}})
		if wantResult(t, "pin.write", out[0], &pin) && (pin.NodeID != n0 || pin.Level == nil || *pin.Level != 1) {
			t.Errorf("pin.write {level: 1} answered %+v", pin)
		}
	})

	t.Run("fleet tools", func(t *testing.T) {
		// Not in parallel: its fan-out calls every node's echo, which
		// "rate limited" exhausts on n1 (10 calls a second) when they
		// run together. Run first, it is alone.
		//
		// Listed first (call.mjs lists every tool), so the client checks
		// each structuredContent against the fleet tools' outputSchemas.
		out := callTools(t, o, o.token, false,
			call{"fleet-nodes", map[string]any{"labels": map[string]any{"fleet": "mock"}, "limit": 3}},
			call{"okso-find_tools", map[string]any{"query": "echo", "source": "device"}},
			call{"fleet-nodes", map[string]any{"limit": 0}})
		var page struct {
			Nodes []struct {
				NodeID   string   `json:"node_id"`
				Presence string   `json:"presence"`
				Tools    []string `json:"tools"`
			} `json:"nodes"`
			Total      int    `json:"total"`
			NextCursor string `json:"next_cursor"`
		}
		if wantResult(t, "fleet-nodes", out[0], &page) {
			mocks := slices.Sorted(slices.Values(o.nodes))
			if page.Total != len(mocks) || len(page.Nodes) != 3 || page.NextCursor != mocks[2] || page.Nodes[0].NodeID != mocks[0] ||
				page.Nodes[0].Presence != "online" || !slices.Contains(page.Nodes[0].Tools, listedName(echoTool(mocks[0]))) {
				t.Errorf("fleet-nodes answered %+v, want the first 3 of %v", page, mocks)
			}
		}
		var found struct {
			Tools []struct {
				Template struct {
					Pattern string `json:"pattern"`
					Nodes   int    `json:"nodes"`
				} `json:"template"`
			} `json:"tools"`
		}
		if wantResult(t, "okso-find_tools", out[1], &found) &&
			(len(found.Tools) != 1 || found.Tools[0].Template.Pattern != "sysecho-*-echo-invoke" || found.Tools[0].Template.Nodes < len(o.nodes)) {
			t.Errorf("okso-find_tools answered %+v, want one echo template of every node", found)
		}
		wantError(t, "fleet-nodes with limit 0", out[2], "E_MANIFEST_INVALID")

		// fleet-call on every node: a row each, which the client checks
		// against the tool's outputSchema, and a progress notification
		// per node finished.
		var fan struct {
			Progress []struct {
				Progress, Total float64
				Message         string
			} `json:"progress"`
			Outcome outcome `json:"outcome"`
		}
		runScript(t, clientEnv(o.mcpURL, o.token), &fan, "progress.mjs",
			`{"name":"fleet-call","arguments":{"tool":"sysecho-*-echo-invoke","arguments":{"message":"hi"}}}`)
		var run struct {
			Results []struct {
				NodeID string `json:"node_id"`
				OK     bool   `json:"ok"`
			} `json:"results"`
			Summary struct {
				Targeted, OK int
			} `json:"summary"`
		}
		if wantResult(t, "fleet-call", fan.Outcome, &run) && (run.Summary.OK != len(o.nodes) || len(run.Results) != len(o.nodes)) {
			t.Errorf("fleet-call answered %+v, want a row of every node (%d)", run, len(o.nodes))
		}
		if len(fan.Progress) != len(o.nodes) || fan.Progress[len(fan.Progress)-1].Progress != float64(len(o.nodes)) ||
			fan.Progress[0].Total != float64(len(o.nodes)) || !strings.HasSuffix(fan.Progress[0].Message, " ok") {
			t.Errorf("fleet-call progress %+v, want one per node of %d", fan.Progress, len(o.nodes))
		}
	})

	t.Run("errors are results", func(t *testing.T) {
		t.Parallel()
		out := callTools(t, o, o.token, false,
			call{echoTool(n0), map[string]any{"message": strings.Repeat("a", 1025)}},
			call{echoTool(n0), map[string]any{"message": "x", "zzz_secret": 1}},
			call{pinWriteTool(n0), map[string]any{"level": 1}},
			call{subscribeTool(n0), map[string]any{"interval_ms": 1000}}, // no progressToken
		)
		e := wantError(t, "echo of 1025 characters", out[0], "E_MANIFEST_INVALID")
		if e.Code != "" && !strings.Contains(e.Message, "argument message") {
			t.Errorf("echo of 1025 characters: %q does not name the argument (want %q in it)", e.Message, "argument message")
		}
		e = wantError(t, "echo with an undeclared argument", out[1], "E_MANIFEST_INVALID")
		if strings.Contains(e.Message, "zzz_secret") {
			t.Errorf("echo with an undeclared argument: %q repeats the caller's name zzz_secret", e.Message)
		}
		if e.Code != "" && !strings.Contains(e.Message, "(it declares: message)") {
			t.Errorf("echo with an undeclared argument: %q does not list the declared arguments", e.Message)
		}
		wantError(t, "pin.write with a read-only token", out[2], "E_SAFETY_DENIED")
		wantError(t, "subscribe without a progressToken", out[3], "E_BAD_REQUEST")

		// A subscribe with a progressToken and a bad interval.
		p := startScript(t, clientEnv(o.mcpURL, o.token), "subscribe.mjs",
			fmt.Sprintf(`{"tool":%q,"arguments":{"interval_ms":999},"frames":1,"then":"abort"}`, subscribeTool(n0)))
		var ev subscribeEvent
		p.next(30*time.Second, &ev)
		if ev.Outcome == nil {
			t.Fatalf("subscribe with interval_ms 999: want the call's outcome at once, got %+v", ev)
		}
		e = wantError(t, "subscribe with interval_ms 999", *ev.Outcome, "E_MANIFEST_INVALID")
		if e.Code != "" && !strings.Contains(e.Message, "argument interval_ms") {
			t.Errorf("subscribe with interval_ms 999: %q does not name the argument (want %q in it)", e.Message, "argument interval_ms")
		}
		p.finish()
	})

	t.Run("unknown tool is a JSON-RPC error", func(t *testing.T) {
		t.Parallel()
		out := callTools(t, o, o.token, false,
			call{echoTool("0000000000000000000000000z"), map[string]any{"message": "ping"}},
			call{"no_such_tool", nil})
		for i, o := range out {
			if o.Error == nil || o.Error.Code != -32602 {
				t.Errorf("unknown tool %d: want an McpError -32602, got %+v", i, o)
				continue
			}
			e, bad := parseEnvelope(o.Error.Data)
			if bad != "" || e.Code != "E_TOOL_NOT_FOUND" {
				t.Errorf("unknown tool %d: error data %s, want the E_TOOL_NOT_FOUND envelope %s", i, o.Error.Data, bad)
			}
		}
	})

	t.Run("rate limited", func(t *testing.T) {
		t.Parallel()
		// echo is limited to 10 calls a second per node (and 4 at a time).
		calls := make([]call, 40)
		for i := range calls {
			calls[i] = call{echoTool(n1), map[string]any{"message": fmt.Sprint(i)}}
		}
		out := callTools(t, o, o.token, true, calls...)
		limited, threw := 0, 0
		for i, oc := range out {
			what := fmt.Sprintf("echo %d of 40", i)
			switch {
			case oc.Error != nil:
				// Reported once below: it is the same exception each time.
				if threw++; threw == 1 {
					t.Errorf("%s: the client threw %s %q; want a result (E_RATE_LIMITED with isError, or the echo)",
						what, oc.Error.Name, oc.Error.Message)
				}
			case oc.Result != nil && oc.Result.IsError:
				if wantError(t, what, oc, "E_RATE_LIMITED").Code == "E_RATE_LIMITED" {
					limited++
				}
			default:
				var echo struct {
					Message string `json:"message"`
				}
				if wantResult(t, what, oc, &echo) && echo.Message != fmt.Sprint(i) {
					t.Errorf("%s answered %q", what, echo.Message)
				}
			}
		}
		if threw > 0 {
			t.Errorf("the client threw on %d of 40 calls", threw)
		}
		if limited == 0 || limited == len(out) {
			t.Errorf("%d of 40 concurrent echo calls to one node were rate limited (readable as data); want some, not all", limited)
		}
	})

	t.Run("scopes imply the classes below", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			scope   string
			mutates bool
		}{
			{auth.ScopeReadOnly, false},
			{auth.ScopeMutating, true},
			{auth.ScopeDestructive, true},
		} {
			token := o.mint(t, c.scope)
			var l listed
			runScript(t, clientEnv(o.mcpURL, token), &l, "list.mjs")
			want := oksoTools()
			for _, n := range o.nodes {
				want = append(want, readOnlyTools(n)...)
				if c.mutates {
					want = append(want, listedName(pinWriteTool(n)))
				}
			}
			if c.mutates { // the caller-tool relay's own tools
				want = append(want, mcp.ToolCallerListen, mcp.ToolCallerResponse)
			}
			slices.Sort(want)
			got := slices.Sorted(slices.Values(l.names()))
			if !slices.Equal(got, want) {
				t.Errorf("a token with only %s lists %d tools, want %d:\n got %v\nwant %v", c.scope, len(got), len(want), got, want)
			}
			if c.scope == auth.ScopeReadOnly {
				continue
			}
			out := callTools(t, o, token, false, call{echoTool(n0), map[string]any{"message": "implied"}})
			var echo struct {
				Message string `json:"message"`
			}
			if wantResult(t, "echo with only "+c.scope, out[0], &echo) && echo.Message != "implied" {
				t.Errorf("echo with only %s answered %q", c.scope, echo.Message)
			}
		}
	})

	t.Run("metric frames as progress, cancel ends the stream", func(t *testing.T) {
		t.Parallel()
		// A token of its own: a stateless gateway can tell the cancel's
		// call only by the token and the JSON-RPC id, which every
		// TypeScript client counts from 0.
		id := requestID(t)
		p := subscribe(t, o, o.mint(t, auth.ScopeReadOnly), id, n2, "abort")
		var ev subscribeEvent
		p.next(30*time.Second, &ev)
		if !ev.Aborted {
			t.Fatalf("want {aborted}, got %+v", ev)
		}
		// The client still holds its connection: only the cancel can end
		// the stream now.
		if e, ok := o.audit.wait(streamEnd, streamClosed(id)); !ok {
			t.Errorf("the stream of a cancelled call (request %s) did not end within %s while its client stayed connected", id, streamEnd)
		} else {
			t.Logf("cancelled stream closed with %s after %s", e.Code, e.Duration)
		}
		p.finish()
	})

	t.Run("a client that closes its transport ends its stream", func(t *testing.T) {
		t.Parallel()
		id := requestID(t)
		p := subscribe(t, o, o.token, id, n3, "close")
		var ev subscribeEvent
		p.next(30*time.Second, &ev)
		if !ev.Closed {
			t.Fatalf("want {closed}, got %+v", ev)
		}
		wantStreamClosed(t, o, id, "closed its transport")
		p.finish()
	})

	t.Run("a client that dies ends its stream", func(t *testing.T) {
		t.Parallel()
		id := requestID(t)
		p := subscribe(t, o, o.token, id, n3, "wait")
		var ev subscribeEvent
		p.next(30*time.Second, &ev)
		if !ev.Waiting {
			t.Fatalf("want {waiting}, got %+v", ev)
		}
		p.kill()
		wantStreamClosed(t, o, id, "was killed")
	})
}

// subscribeEvent is one line of subscribe.mjs.
type subscribeEvent struct {
	Progress *struct {
		Progress float64 `json:"progress"`
		Message  string  `json:"message"`
	} `json:"progress"`
	Outcome *outcome `json:"outcome"`
	Aborted bool     `json:"aborted"`
	Closed  bool     `json:"closed"`
	Waiting bool     `json:"waiting"`
}

// subscribe starts subscribe.mjs, with the token, on a node's metrics
// every second, reads two frames, checks that each is a progress
// notification whose message is a frame of that node, and leaves the
// script to do then.
func subscribe(t *testing.T, o *okso, token, requestID, node, then string) *nodeProc {
	t.Helper()
	p := startScript(t, clientEnv(o.mcpURL, token, "OKSO_REQUEST_ID="+requestID), "subscribe.mjs",
		fmt.Sprintf(`{"tool":%q,"arguments":{"interval_ms":1000},"frames":2,"then":%q}`, subscribeTool(node), then))
	for i := range 2 {
		var ev subscribeEvent
		p.next(30*time.Second, &ev)
		if ev.Progress == nil {
			t.Fatalf("frame %d: want a progress notification, got %+v", i+1, ev)
		}
		var frame struct {
			NodeID string `json:"node_id"`
			TsMs   int64  `json:"ts_ms"`
		}
		if err := json.Unmarshal([]byte(ev.Progress.Message), &frame); err != nil || frame.NodeID != node || frame.TsMs == 0 {
			t.Errorf("frame %d: progress message %q is not a metrics frame of node %s (%v)", i+1, ev.Progress.Message, node, err)
		}
	}
	return p
}

// wantStreamClosed waits for the audit event of the stream's end.
func wantStreamClosed(t *testing.T, o *okso, id, what string) {
	t.Helper()
	e, ok := o.audit.wait(streamEnd, streamClosed(id))
	if !ok {
		t.Errorf("the stream of a client that %s (request %s) did not end within %s", what, id, streamEnd)
		return
	}
	if e.Code != fmt.Sprint(bus.StreamNormal) {
		t.Errorf("the stream of a client that %s closed with %s, want %d (normal)", what, e.Code, bus.StreamNormal)
	}
}

// requestID is a request id unique to the test, which the client sends as
// X-Request-Id and okso's audit events carry.
func requestID(t *testing.T) string {
	id := "interop-" + rand.Text()
	t.Logf("request id %s", id)
	return id
}
