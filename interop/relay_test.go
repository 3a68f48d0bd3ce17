package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/bearer"
)

// relayTool is the tool relay.mjs offers, as the other agents list it:
// {caller_id}_{tool}.
const relayTool = "ts_upper"

// relayGone bounds how long the gateway may take to drop the tools of a
// listen whose client cancelled it or died, and to fail the calls waiting
// on it. It knows at once (DESIGN §9.3): the bound is for a loaded machine.
const relayGone = 5 * time.Second

// relayLine is one line of relay.mjs.
type relayLine struct {
	Ready *struct {
		ListenID string   `json:"listen_id"`
		Tools    []string `json:"tools"`
	} `json:"ready"`
	Ignored string   `json:"ignored"`
	Ended   *outcome `json:"ended"`
	Done    *struct {
		Requests int       `json:"requests"`
		Texts    []any     `json:"texts"`
		Accepted int       `json:"accepted"`
		Refused  []outcome `json:"refused"`
		Listen   outcome   `json:"listen"`
	} `json:"done"`
}

// nextRelay decodes relay.mjs's next line; what it printed is in the
// message of a failure.
func nextRelay(t *testing.T, p *nodeProc, timeout time.Duration) (relayLine, string) {
	t.Helper()
	var raw json.RawMessage
	p.next(timeout, &raw)
	var l relayLine
	if err := json.Unmarshal(raw, &l); err != nil {
		t.Fatalf("relay.mjs printed %s: %v", raw, err)
	}
	return l, string(raw)
}

// startListener runs relay.mjs with its options and returns once its
// listen is ready, with the listen id.
func startListener(t *testing.T, o *okso, token, opts string) (*nodeProc, string) {
	t.Helper()
	p := startScript(t, clientEnv(o.mcpURL, token), "relay.mjs", opts)
	l, raw := nextRelay(t, p, 30*time.Second)
	if l.Ready == nil || l.Ready.ListenID == "" {
		t.Fatalf("relay.mjs: want {ready} with a listen id first, got %s\nstderr:\n%s\nokso log:\n%s", raw, p.stderr, o.stderr)
	}
	if !slices.Equal(l.Ready.Tools, []string{relayTool}) {
		t.Errorf("caller_tools_ready names the tools %v, want [%s]", l.Ready.Tools, relayTool)
	}
	return p, l.Ready.ListenID
}

// connectCaller connects a Go SDK client, the calling agent, until the
// test ends.
func connectCaller(t *testing.T, url, token string) *sdk.ClientSession {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-interop-caller", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{
		Endpoint: url, HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: tr}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect the Go SDK client to %s: %v", url, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// callGo makes one tools/call with the Go SDK client and returns it as an
// outcome, as the client scripts report theirs. It is safe for concurrent
// use.
func callGo(t *testing.T, s *sdk.ClientSession, name string, args any) outcome {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		thrown := &clientThrown{Name: fmt.Sprintf("%T", err), Message: err.Error()}
		var rpcErr *jsonrpc.Error
		if errors.As(err, &rpcErr) {
			thrown.Code, thrown.Data = int(rpcErr.Code), rpcErr.Data
		}
		return outcome{Error: thrown}
	}
	var r callResult
	b, err := json.Marshal(res)
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		t.Errorf("the Go SDK's result %s: %v", b, err) // callGo runs on other goroutines too: no Fatal
		return outcome{}
	}
	return outcome{Result: &r}
}

// listedTool lists the tools with the Go SDK client and returns the one
// named, or nil.
func listedTool(t *testing.T, s *sdk.ClientSession, name string) *sdk.Tool {
	t.Helper()
	for tool, err := range s.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		if tool.Name == name {
			return tool
		}
	}
	return nil
}

// waitListing lists the tools until name is listed (or, with listed false,
// is no longer), within d; it returns the tool and how long it took.
func waitListing(t *testing.T, s *sdk.ClientSession, name string, listed bool, d time.Duration) (*sdk.Tool, time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		tool := listedTool(t, s, name)
		if (tool != nil) == listed {
			return tool, time.Since(start)
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s listed = %v did not come within %s", name, listed, d)
		case <-poll.C:
		}
	}
}

// wantUpper checks that a call of ts_upper with text came back as the
// listener's answer: structuredContent exactly {"text": TEXT}.
func wantUpper(t *testing.T, text string, o outcome) {
	t.Helper()
	var got map[string]any
	what := fmt.Sprintf("%s {text: %q}", relayTool, text)
	if wantResult(t, what, o, &got) && !reflect.DeepEqual(got, map[string]any{"text": strings.ToUpper(text)}) {
		t.Errorf("%s: structuredContent %s, want {\"text\":%q}", what, o.Result.StructuredContent, strings.ToUpper(text))
	}
}

// wantGone checks a call of a tool whose listen ended: an unknown tool
// (once the gateway no longer lists it) or E_NODE_OFFLINE (before).
func wantGone(t *testing.T, o outcome) {
	t.Helper()
	if o.Error != nil {
		e, bad := parseEnvelope(o.Error.Data)
		if o.Error.Code != -32602 || bad != "" || e.Code != "E_TOOL_NOT_FOUND" {
			t.Errorf("a call after the listen ended threw %d %q (data %s), want -32602 with E_TOOL_NOT_FOUND %s",
				o.Error.Code, o.Error.Message, o.Error.Data, bad)
		}
		return
	}
	wantError(t, "a call after the listen ended", o, "E_NODE_OFFLINE")
}

// TestRelayTypeScriptListener: the caller-tool relay (DESIGN §9.3) with
// the official TypeScript SDK's client as the listening agent, because
// that is what most agents run, and the Go SDK's client as the calling
// one (another token of the tenant). The TypeScript client keeps
// caller_tools_listen open with onprogress, reads each request from a
// progress notification, and answers with caller_tool_response through
// the same client or a second one.
func TestRelayTypeScriptListener(t *testing.T) {
	o := startOkso(t, 0)
	listener := o.mintAs(t, "agent-ts", auth.ScopeMutating)
	caller := connectCaller(t, o.mcpURL, o.mintAs(t, "agent-go", auth.ScopeMutating))

	// One listen after the other: the second of one caller_id would
	// replace the first.
	var firstListen string
	t.Run("answered through the same client, then cancelled", func(t *testing.T) {
		p, listenID := startListener(t, o, listener, `{"answer":"same"}`)
		firstListen = listenID
		tool, took := waitListing(t, caller, relayTool, true, relayGone)
		t.Logf("%s listed %s after the listen was ready", relayTool, took)
		want := `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`
		if b, _ := json.Marshal(tool.InputSchema); !jsonEqual(b, []byte(want)) {
			t.Errorf("%s lists the input schema %s, want the declared %s", relayTool, b, want)
		}
		if tool.Annotations == nil || tool.Annotations.ReadOnlyHint {
			t.Errorf("%s annotations %+v: a tool declared without readOnlyHint is not read-only", relayTool, tool.Annotations)
		}
		if c := tool.Meta["io.okso/caller"]; c != "ts" {
			t.Errorf(`%s: _meta["io.okso/caller"] = %v, want "ts"`, relayTool, c)
		}

		var sent []string
		for _, text := range []string{"hi", "Relay me", "okso"} {
			sent = append(sent, text)
			wantUpper(t, text, callGo(t, caller, relayTool, map[string]any{"text": text}))
		}
		// The relay's audit: the call by its caller, the answer by the
		// listener, each allowed.
		for _, w := range []struct{ tool, subject string }{{relayTool, "agent-go"}, {"caller_tool_response", "agent-ts"}} {
			if _, ok := o.audit.wait(relayGone, func(e bus.AuditEvent) bool {
				return e.Tool == w.tool && e.Subject == w.subject && e.Decision == bus.DecisionAllowed
			}); !ok {
				t.Errorf("no audit event: %s by %s allowed", w.tool, w.subject)
			}
		}

		const concurrent = 8
		outs := make(chan struct {
			text string
			o    outcome
		}, concurrent)
		for i := range concurrent {
			text := fmt.Sprintf("concurrent %d", i)
			sent = append(sent, text)
			go func() {
				outs <- struct {
					text string
					o    outcome
				}{text, callGo(t, caller, relayTool, map[string]any{"text": text})}
			}()
		}
		for range concurrent {
			r := <-outs
			wantUpper(t, r.text, r.o)
		}

		// Checked against the declared schema before anything is relayed,
		// and named (DESIGN §5).
		for _, args := range []map[string]any{{"text": 5}, {}, {"text": nil}, {"text": []string{"hi"}}} {
			what := fmt.Sprintf("%s %s", relayTool, mustJSON(args))
			e := wantError(t, what, callGo(t, caller, relayTool, args), "E_MANIFEST_INVALID")
			if e.Code != "" && !strings.Contains(e.Message, "argument text") {
				t.Errorf("%s: %q does not name the argument (want %q in it)", what, e.Message, "argument text")
			}
		}

		// A line on its stdin: the script cancels the listen (the SDK
		// sends notifications/cancelled) and reports what it saw, and
		// keeps its connections: only the cancel can end the listen.
		if _, err := io.WriteString(p.stdin, "stop\n"); err != nil {
			t.Fatalf("write to relay.mjs: %v", err)
		}
		l, raw := nextRelay(t, p, 30*time.Second)
		if l.Done == nil {
			t.Fatalf("relay.mjs: want {done} once told to stop, got %s", raw)
		}
		_, took = waitListing(t, caller, relayTool, false, relayGone)
		t.Logf("%s unlisted %s after the listener cancelled its listen (it ended as %s)", relayTool, took, mustJSON(l.Done.Listen))
		wantGone(t, callGo(t, caller, relayTool, map[string]any{"text": "late"}))
		p.finish()
		if l.Done.Requests != len(sent) || l.Done.Accepted != len(sent) || len(l.Done.Refused) > 0 {
			t.Errorf("the listener saw %d requests and had %d answers accepted and %d refused %s; want the %d valid calls, each answered once",
				l.Done.Requests, l.Done.Accepted, len(l.Done.Refused), mustJSON(l.Done.Refused), len(sent))
		}
		var texts []string
		for _, x := range l.Done.Texts {
			s, ok := x.(string)
			if !ok {
				t.Errorf("the listener got the text %s: invalid arguments reached it", mustJSON(x))
			}
			texts = append(texts, s)
		}
		slices.Sort(texts)
		slices.Sort(sent)
		if !slices.Equal(texts, sent) {
			t.Errorf("the listener got the texts %q, want exactly those of the valid calls %q", texts, sent)
		}
	})

	t.Run("answered through a second client, killed mid-call", func(t *testing.T) {
		p, listenID := startListener(t, o, listener, `{"answer":"second","ignore":["wait"]}`)
		if listenID == firstListen {
			t.Errorf("a new listen has the ended one's id %s", listenID)
		}
		waitListing(t, caller, relayTool, true, relayGone)
		wantUpper(t, "second", callGo(t, caller, relayTool, map[string]any{"text": "second"}))

		waiting := make(chan outcome, 1)
		go func() { waiting <- callGo(t, caller, relayTool, map[string]any{"text": "wait"}) }()
		if l, raw := nextRelay(t, p, 30*time.Second); l.Ignored == "" {
			t.Fatalf("relay.mjs: want {ignored} for the call it leaves waiting, got %s", raw)
		}
		killed := time.Now()
		p.kill() // the kernel closes its connections, the listen's with them
		select {
		case oc := <-waiting:
			t.Logf("the waiting call ended %s after the listener died", time.Since(killed))
			wantError(t, "a call waiting on a listener that died", oc, "E_NODE_OFFLINE")
		case <-time.After(relayGone):
			t.Fatalf("a call waiting on a listener that died still waits after %s", relayGone)
		}
		_, took := waitListing(t, caller, relayTool, false, relayGone)
		t.Logf("%s unlisted %s after the listener died", relayTool, took)
		wantGone(t, callGo(t, caller, relayTool, map[string]any{"text": "late"}))
	})
}

// jsonEqual reports whether two JSON documents are equal as values.
func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// mustJSON is v as JSON, for messages.
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v (%v)", v, err)
	}
	return string(b)
}
