package roles

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
)

// relay is a TCP relay to one address that a test can cut (every
// connection closed, new ones refused) and restore on the same port.
type relay struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	r := &relay{t: t, target: target, conns: map[net.Conn]struct{}{}}
	r.listen("127.0.0.1:0")
	r.addr = r.ln.Addr().String()
	t.Cleanup(func() { r.cut(); r.wg.Wait() })
	return r
}

func (r *relay) listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatalf("relay listen %s: %v", addr, err)
	}
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Go(func() { r.pipe(c) })
		}
	})
}

func (r *relay) pipe(c net.Conn) {
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.ln == nil { // cut meanwhile
		r.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	r.conns[c], r.conns[up] = struct{}{}, struct{}{}
	r.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
	wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
	wg.Wait()
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

// cut closes the listener and every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for c := range r.conns {
		c.Close()
	}
}

// restore listens again on the relay's port.
func (r *relay) restore() { r.listen(r.addr) }

// TestGatewayLosesNATS: while its NATS connection is down, a gateway
// says so (tools/list and calls answer E_INTERNAL "registry unavailable"
// instead of an empty list and "unknown tool"), logs one line when the
// link goes and one when it is back, and then serves again.
func TestGatewayLosesNATS(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	c, err := loadCommon(log, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	np, err := openNATS(natsConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer np.close()
	link := startRelay(t, strings.TrimPrefix(np.clientURL(), "nats://"))
	tp, err := newTierPart(t.Context(), c, np, tierConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.close()
	gp, err := newGatewayPart(t.Context(), c, &natsPart{url: "nats://" + link.addr, replicas: 1},
		gatewayConfig{Addr: "127.0.0.1:0", Budget: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer gp.close()
	fleet, err := newFleetPart(c, 1, DefaultTenant, []string{tp.url()}, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runGroup(ctx, func(g *run.Group) { tp.actors(g); gp.actors(g); fleet.actors(g) })
	}()
	defer func() {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("roles stopped with %v", err)
		}
	}()
	wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer wcancel()
	if err := gp.gw.Wait(wctx, func(m map[string]int) bool { return m[DefaultTenant] == 1 }); err != nil {
		t.Fatal("the gateway never listed the device")
	}
	var node string
	for id := range gp.gw.NodeIDs() {
		node = id
	}
	tok, err := c.signer.Mint(auth.MintOptions{Subject: "agent", Tenant: DefaultTenant, Scopes: []string{auth.ScopeReadOnly}})
	if err != nil {
		t.Fatal(err)
	}
	list := func() mcpAnswer {
		return postMCP(t, gp.url(), tok, nil, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
	}
	listsNode := func() bool {
		b, _ := json.Marshal(list().message)
		return strings.Contains(string(b), echoName(node))
	}
	if !listsNode() {
		t.Fatalf("tools/list lacks %s", echoName(node))
	}

	link.cut()
	eventually(t, "a log line saying NATS is lost", func() bool { return strings.Contains(logs.String(), "NATS connection lost") })
	m, _ := list().message.(map[string]any)
	e, _ := m["error"].(map[string]any)
	data, _ := e["data"].(map[string]any)
	if e["code"] != float64(-32603) || !strings.Contains(e["message"].(string), "registry unavailable") || data["code"] != bus.CodeInternal {
		t.Errorf("tools/list without NATS: %v, want JSON-RPC error -32603 registry unavailable with E_INTERNAL", m)
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + echoName(node) + `","arguments":{"message":"x"}}}`
	sessionless := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"` + echoName(node) +
		`","arguments":{"message":"x"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	for version, a := range map[string]mcpAnswer{
		"2025-11-25": postMCP(t, gp.url(), tok, nil, call),
		"2026-07-28": postMCP(t, gp.url(), tok, map[string]string{"Mcp-Protocol-Version": "2026-07-28",
			"Mcp-Method": "tools/call", "Mcp-Name": echoName(node)}, sessionless),
	} {
		m, _ := a.message.(map[string]any)
		res, _ := m["result"].(map[string]any)
		meta, _ := res["_meta"].(map[string]any)
		env, _ := meta[mcp.MetaError].(map[string]any)
		if res["isError"] != true || env["code"] != bus.CodeInternal || !strings.Contains(env["message"].(string), "registry unavailable") {
			t.Errorf("%s: a call without NATS: %v, want E_INTERNAL registry unavailable", version, a.message)
		}
	}

	link.restore()
	eventually(t, "a log line saying NATS is back", func() bool { return strings.Contains(logs.String(), "NATS connection back") })
	eventually(t, "tools/list listing the device again", listsNode)
	if n := strings.Count(logs.String(), "NATS connection lost"); n != 1 {
		t.Errorf("%d lines say the link was lost, want 1", n)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("stopped early")
	}
}
