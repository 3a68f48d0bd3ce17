package roles

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
)

// stepStream is a device's metrics.subscribe that sends one frame when it
// starts and one more each time the test asks, and reports when it ends,
// so a test knows that nothing but a cancellation can end it.
type stepStream struct {
	started, exited chan struct{}
	step            chan struct{}
}

func newStepStream() *stepStream {
	return &stepStream{started: make(chan struct{}, 8), exited: make(chan struct{}, 8), step: make(chan struct{})}
}

func (p *stepStream) handler(node string) agent.StreamHandler {
	return func(ctx context.Context, _ json.RawMessage, emit func(any) error) error {
		p.started <- struct{}{}
		defer func() { p.exited <- struct{}{} }()
		for {
			if err := emit(agent.MetricsSample{TsMs: time.Now().UnixMilli(), NodeID: node, MemTotalBytes: 1}); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-p.step:
			}
		}
	}
}

// rpcMessage is one JSON-RPC message of an MCP answer stream.
type rpcMessage struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
}

// mcpStream posts one MCP request and returns the messages of its SSE
// answer, and a function that hangs up.
func mcpStream(t *testing.T, url, token, version, body string) (<-chan rpcMessage, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	req.Header.Set("Authorization", "Bearer "+token)
	if version >= "2026-07-28" {
		req.Header.Set("Mcp-Method", "tools/call")
		var m struct {
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal([]byte(body), &m)
		req.Header.Set("Mcp-Name", m.Params.Name)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		t.Fatalf("stream answered %d", resp.StatusCode)
	}
	out := make(chan rpcMessage, 64)
	go func() {
		defer close(out)
		for e := range events(resp) {
			var m rpcMessage
			if json.Unmarshal([]byte(e.data), &m) == nil {
				out <- m
			}
		}
	}()
	t.Cleanup(cancel)
	return out, cancel
}

func nextMessage(t *testing.T, ch <-chan rpcMessage, what string) rpcMessage {
	t.Helper()
	select {
	case m, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the stream ended", what)
		}
		return m
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: nothing within 5s", what)
	}
	return rpcMessage{}
}

// cancelNotification posts notifications/cancelled for request id and
// wants it accepted.
func cancelNotification(t *testing.T, url, token string, id int) {
	t.Helper()
	a := postMCP(t, url, token, nil, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":`+strconv.Itoa(id)+`,"reason":"test"}}`)
	if a.status != http.StatusAccepted {
		t.Fatalf("cancel %d answered %d %s", id, a.status, a.text)
	}
}

func subscribeCall(id int, node, version string) string {
	meta := `"progressToken":"p"`
	if version >= "2026-07-28" {
		meta += `,"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientCapabilities":{}`
	}
	return `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"sys.` + node +
		`.metrics.subscribe","arguments":{"interval_ms":1000},"_meta":{` + meta + `}}}`
}

// TestMCPStreamCancel: in stateless mode, notifications/cancelled stops a
// running subscription whichever gateway replica it lands on, and only
// its own caller's can: another token's, or one naming another request,
// changes nothing.
func TestMCPStreamCancel(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	p := newStepStream()
	node, _ := f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		o.Streams = map[string]agent.StreamHandler{"metrics.subscribe": p.handler(id)}
	})
	other := f.secondGateway(gatewayConfig{}).url()
	mine := f.token(auth.MintOptions{Subject: "alice"})
	theirs := f.token(auth.MintOptions{Subject: "mallory"})

	msgs, _ := mcpStream(t, f.a.MCPURL(), mine, "2025-11-25", subscribeCall(7, node, "2025-11-25"))
	wait(t, p.started, "the device's stream")
	if m := nextMessage(t, msgs, "first frame"); m.Method != "notifications/progress" {
		t.Fatalf("first message %+v, want a progress notification", m)
	}
	cancelNotification(t, other, theirs, 7) // another caller's request 7
	cancelNotification(t, other, mine, 8)   // another request of mine
	p.step <- struct{}{}
	if m := nextMessage(t, msgs, "second frame"); m.Method != "notifications/progress" {
		t.Fatalf("after foreign cancellations: %+v, want the stream to go on", m)
	}

	cancelNotification(t, other, mine, 7)
	wait(t, p.exited, "the device's stream to stop after the cancellation")
	var ended bool
	for m := range msgs {
		if m.Result != nil {
			var res struct {
				StructuredContent struct{ Code int } `json:"structuredContent"`
			}
			if json.Unmarshal(m.Result, &res) != nil || res.StructuredContent.Code != 1000 {
				t.Errorf("result %s, want code 1000", m.Result)
			}
			ended = true
		}
	}
	if !ended {
		t.Error("the stream ended without its result")
	}
	if n := f.a.gw.gw.Streams().Open(); n != 0 {
		t.Errorf("%d streams still open", n)
	}
}

// TestMCPStreamHangUp: a client that hangs up ends its stream at once,
// not at the next frame, on every protocol revision.
func TestMCPStreamHangUp(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	p := newStepStream()
	node, _ := f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		o.Streams = map[string]agent.StreamHandler{"metrics.subscribe": p.handler(id)}
	})
	tok := f.token(auth.MintOptions{})
	for i, version := range []string{"2025-11-25", "2025-06-18", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			msgs, hangUp := mcpStream(t, f.a.MCPURL(), tok, version, subscribeCall(20+i, node, version))
			wait(t, p.started, "the device's stream")
			if m := nextMessage(t, msgs, "first frame"); m.Method != "notifications/progress" {
				t.Fatalf("first message %+v, want a progress notification", m)
			}
			hangUp()
			wait(t, p.exited, "the device's stream to stop after the client hung up")
		})
	}
}
