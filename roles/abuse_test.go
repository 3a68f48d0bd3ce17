package roles

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
)

// TestUnauthenticatedBodiesHoldNothing: a client without a valid token
// that declares a body and never sends it is answered 401 at once and
// holds nothing: 50 of them all get their 401 within 2 s, on a kept
// connection or not, and a device can still connect meanwhile.
func TestUnauthenticatedBodiesHoldNothing(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	host := strings.TrimPrefix(strings.TrimSuffix(f.a.MCPURL(), "/mcp"), "http://")
	paths := []string{"/mcp", "/mcp/tools/call"}
	tokens := []string{"", "Authorization: Bearer not-a-token\r\n"}
	const n = 50
	var wg sync.WaitGroup
	statuses := make(chan string, n)
	deadline := time.Now().Add(2 * time.Second)
	for i := range n {
		wg.Go(func() {
			c, err := net.Dial("tcp", host)
			if err != nil {
				statuses <- "dial: " + err.Error()
				return
			}
			defer c.Close()
			_ = c.SetDeadline(deadline)
			req := "POST " + paths[i%2] + " HTTP/1.1\r\nHost: " + host + "\r\n" + tokens[i/2%2] +
				"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n" +
				"Content-Length: 100000\r\n\r\n{\"jsonrpc\":\"2.0\""
			if _, err := c.Write([]byte(req)); err != nil {
				statuses <- "write: " + err.Error()
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				statuses <- "read: " + err.Error()
				return
			}
			resp.Body.Close()
			statuses <- resp.Status
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if !strings.HasPrefix(s, "401") {
			t.Errorf("an unfinished body without a valid token got %q, want 401 within 2s", s)
		}
	}
	f.connectDevice(DefaultTenant, nil)
}

// TestFloodedMCPListenerSparesDevices: the MCP listener holds at most
// --mcp-max-connections at once; a flood of idle connections waits
// beyond that instead of taking the process's descriptors, and the device
// listener goes on serving devices meanwhile.
func TestFloodedMCPListenerSparesDevices(t *testing.T) {
	const limit = 20
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Gateway.MaxConnections = limit })
	host := strings.TrimPrefix(strings.TrimSuffix(f.a.MCPURL(), "/mcp"), "http://")
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// limit connections that send half a request header and wait: the
	// listener holds them all, and no more.
	for range limit {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	// One more is accepted by the kernel but not served while they hold.
	extra, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	held = append(held, extra)
	if _, err := extra.Write([]byte("GET /healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
		if err != nil {
			answered <- err.Error()
			return
		}
		resp.Body.Close()
		answered <- resp.Status
	}()
	// Devices connect meanwhile, on their own listener.
	f.connectDevice(DefaultTenant, nil)
	select {
	case s := <-answered:
		t.Fatalf("connection %d was served (%s) while %d were held", limit+1, s, limit)
	default:
	}
	// Once one held connection goes, the waiting one is served.
	held[0].Close()
	select {
	case s := <-answered:
		if !strings.HasPrefix(s, "200") {
			t.Errorf("the waiting connection got %q, want 200", s)
		}
	case <-time.After(5 * time.Second):
		t.Error("the waiting connection was not served after a slot freed")
	}
}

// TestBatchBounded: a JSON-RPC batch (protocol 2025-03-26) runs at most 16
// calls; a bigger one is refused whole, before any call runs, on a
// stateless and a stateful gateway; a batch of a later revision, which
// has none, gets the SDK's answer.
func TestBatchBounded(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	var calls atomic.Int64
	node, _ := f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		o.Handlers["echo.invoke"] = func(_ context.Context, args json.RawMessage) (any, error) {
			calls.Add(1)
			return agent.EchoResult{Message: "b", NodeID: id, ReceivedAtMs: time.Now().UnixMilli()}, nil
		}
	})
	stateful := f.secondGateway(gatewayConfig{Stateful: true}).url()
	tok := f.token(auth.MintOptions{})
	batch := func(n int) string {
		var msgs []string
		for i := range n {
			msgs = append(msgs, `{"jsonrpc":"2.0","id":`+strconv.Itoa(i+1)+`,"method":"tools/call","params":{"name":"`+
				echoName(node)+`","arguments":{"message":"b"}}}`)
		}
		return "[" + strings.Join(msgs, ",") + "]"
	}
	hdr := map[string]string{"Mcp-Protocol-Version": "2025-03-26"}
	for _, url := range []string{f.a.MCPURL(), stateful} {
		a := postMCP(t, url, tok, hdr, batch(17))
		m, _ := a.message.(map[string]any)
		e, _ := m["error"].(map[string]any)
		if a.status != http.StatusBadRequest || e["code"] != float64(-32600) {
			t.Errorf("%s: a batch of 17: %d %v, want 400 and -32600", url, a.status, a.message)
		}
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("%d calls of a refused batch ran", n)
	}
	if a := postMCP(t, f.a.MCPURL(), tok, hdr, batch(2)); a.status != http.StatusOK || calls.Load() != 2 {
		t.Errorf("a batch of 2: %d %v %s; %d calls ran, want 2", a.status, a.message, a.text, calls.Load())
	}
	// From 2025-06-18 there are no batches: the SDK's own answer.
	ref := sdkReference(t)
	for _, v := range []string{"2025-06-18", "2025-11-25", "2026-07-28"} {
		hdr := map[string]string{"Mcp-Protocol-Version": v}
		want := postMCP(t, ref, "", hdr, batch(17))
		for _, url := range []string{f.a.MCPURL(), stateful} {
			if a := postMCP(t, url, tok, hdr, batch(17)); a.status != want.status || a.text != want.text || a.message != nil {
				t.Errorf("%s: a batch of 17 of %s: %d %q %v, want the SDK's %d %q", url, v, a.status, a.text, a.message, want.status, want.text)
			}
		}
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("%d calls ran, want 2", n)
	}
}

// TestShutdownDrains: a stopping gateway with --shutdown-drain first goes
// unready while it serves on, each answer closing its connection, so
// that clients move elsewhere before the listener closes rather than
// have a request cut under them.
func TestShutdownDrains(t *testing.T) {
	cfg := AllInOneConfig{
		Gateway: gatewayConfig{Addr: "127.0.0.1:0", Budget: 5 * time.Second, ShutdownDrain: 2 * time.Second},
		Tier:    tierConfig{Addr: "127.0.0.1:0"},
		DataDir: t.TempDir(),
		Tenant:  DefaultTenant,
	}
	a, err := NewAllInOne(t.Context(), slog.New(slog.DiscardHandler), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	base := strings.TrimSuffix(a.MCPURL(), "/mcp")
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	ready := func() int {
		resp, err := client.Get(base + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	eventually(t, "all-in-one ready", func() bool { return ready() == http.StatusOK })
	tok, err := a.Signer().Mint(auth.MintOptions{Subject: "agent", Tenant: DefaultTenant, Scopes: []string{auth.ScopeReadOnly}})
	if err != nil {
		t.Fatal(err)
	}
	list := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, a.MCPURL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("tools/list while draining: %v", err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := list(); resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("before the stop: %d, close %v", resp.StatusCode, resp.Close)
	}
	cancel()
	eventually(t, "/readyz 503 once stopping", func() bool { return ready() == http.StatusServiceUnavailable })
	if resp := list(); resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("while draining: %d, Connection: close %v; want 200 and a closed connection", resp.StatusCode, resp.Close)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("all-in-one stopped with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("all-in-one did not stop")
	}
}
