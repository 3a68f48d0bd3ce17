package roles

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// relay is a TCP relay to one address that a test can cut (every
// connection closed, new ones refused) and restore on the same port, or
// blackhole (connections stay open and every byte is dropped, as on a
// partition) and heal.
type relay struct {
	t      *testing.T
	target string
	addr   string
	holed  atomic.Bool

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
	wg.Go(func() { r.copy(up, c); up.Close() })
	wg.Go(func() { r.copy(c, up); c.Close() })
	wg.Wait()
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, up)
	r.mu.Unlock()
}

// copy forwards src to dst until either fails, dropping what it reads
// while the relay is blackholed.
func (r *relay) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !r.holed.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// blackhole drops every byte from now on, in both directions, on every
// connection; heal forwards them again.
func (r *relay) blackhole() { r.holed.Store(true) }
func (r *relay) heal()      { r.holed.Store(false) }

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

// relayed is a gateway whose NATS link runs through a relay the test
// controls, a device tier on the same NATS directly, and one mock device.
type relayed struct {
	t    *testing.T
	logs *syncBuffer
	link *relay
	gw   *gatewayPart
	node string
	tok  string // may read and drive the pin
}

func startRelayed(t *testing.T) *relayed {
	t.Helper()
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	c, err := loadCommon(log, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	np, err := openNATS(t.Context(), natsConfig{Listen: "127.0.0.1:0", natsSecurity: natsSecurity{Insecure: true}}) // links, not credentials
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(np.close)
	link := startRelay(t, strings.TrimPrefix(np.clientURL(), "nats://"))
	tp, err := newTierPart(t.Context(), c, np, tierConfig{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tp.close)
	gp, err := newGatewayPart(t.Context(), c, &natsPart{url: "nats://" + link.addr, replicas: 1},
		gatewayConfig{Addr: "127.0.0.1:0", Budget: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gp.close)
	fleet, err := newFleetPart(c, fleetMock, 1, DefaultTenant, []string{tp.url()}, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runGroup(ctx, func(g *run.Group) { tp.actors(g); gp.actors(g); fleet.actors(g) })
	}()
	t.Cleanup(func() {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("roles stopped with %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer wcancel()
	if err := gp.gw.Wait(wctx, func(m map[string]int) bool { return m[DefaultTenant] == 1 }); err != nil {
		t.Fatal("the gateway never listed the device")
	}
	r := &relayed{t: t, logs: logs, link: link, gw: gp}
	for id := range gp.gw.Devices().IDs() {
		r.node = id
	}
	if r.tok, err = c.signer.Mint(auth.MintOptions{Subject: "agent", Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeMutating}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *relayed) list() mcpAnswer {
	return postMCP(r.t, r.gw.url(), r.tok, nil, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
}

func (r *relayed) listsNode() bool {
	b, _ := json.Marshal(r.list().message)
	return strings.Contains(string(b), listedName(echoName(r.node)))
}

// call makes one tools/call and returns its result (nil for none).
func (r *relayed) call(version, tool, args string) map[string]any {
	hdr := map[string]string{}
	meta := ""
	if version >= "2026-07-28" {
		hdr = map[string]string{"Mcp-Protocol-Version": version, "Mcp-Method": "tools/call", "Mcp-Name": tool}
		meta = `,"_meta":{"io.modelcontextprotocol/protocolVersion":"` + version + `","io.modelcontextprotocol/clientCapabilities":{}}`
	}
	a := postMCP(r.t, r.gw.url(), r.tok, hdr, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"`+
		tool+`","arguments":`+args+meta+`}}`)
	m, _ := a.message.(map[string]any)
	res, _ := m["result"].(map[string]any)
	return res
}

// wantUnavailable checks that tools/list and calls say the registry is
// unavailable, on each protocol revision, and never reach the device.
func (r *relayed) wantUnavailable() {
	r.t.Helper()
	m, _ := r.list().message.(map[string]any)
	e, _ := m["error"].(map[string]any)
	data, _ := e["data"].(map[string]any)
	msg, _ := e["message"].(string)
	if e["code"] != float64(-32603) || !strings.Contains(msg, "registry unavailable") || data["code"] != schemas.CodeInternal {
		r.t.Errorf("tools/list without NATS: %v, want JSON-RPC error -32603 registry unavailable with E_INTERNAL", m)
	}
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		for _, c := range [][2]string{{echoName(r.node), `{"message":"x"}`}, {"gpio." + r.node + ".pin.write", `{"level":1}`}} {
			res := r.call(version, c[0], c[1])
			meta, _ := res["_meta"].(map[string]any)
			env, _ := meta[mcp.MetaError].(map[string]any)
			msg, _ := env["message"].(string)
			if res["isError"] != true || env["code"] != schemas.CodeInternal || !strings.Contains(msg, "registry unavailable") {
				r.t.Errorf("%s: %s without NATS: %v, want E_INTERNAL registry unavailable", version, c[0], res)
			}
		}
	}
}

// wantPinLow checks that the pin was never driven: a pin.write that had
// waited in a reconnect buffer would have reached the device before this
// read, on the same connection.
func (r *relayed) wantPinLow() {
	r.t.Helper()
	res := r.call("2025-11-25", "gpio."+r.node+".pin.read", `{}`)
	sc, _ := res["structuredContent"].(map[string]any)
	if sc["level"] != float64(0) {
		r.t.Errorf("pin.read after the outage: %v, want level 0: a write its caller was told failed ran later", res)
	}
}

// TestGatewayLosesNATS: while its NATS connection is down, a gateway
// says so (tools/list and calls answer E_INTERNAL "registry unavailable"
// instead of an empty list and "unknown tool"), logs one line when the
// link goes and one when it is back, and then serves again; a call made
// meanwhile never runs later.
func TestGatewayLosesNATS(t *testing.T) {
	r := startRelayed(t)
	if !r.listsNode() {
		t.Fatalf("tools/list lacks %s", echoName(r.node))
	}
	r.link.cut()
	eventually(t, "a log line saying NATS is lost", func() bool { return strings.Contains(r.logs.String(), "NATS connection lost") })
	r.wantUnavailable()

	r.link.restore()
	eventually(t, "a log line saying NATS is back", func() bool { return strings.Contains(r.logs.String(), "NATS connection back") })
	eventually(t, "tools/list listing the device again", r.listsNode)
	if n := strings.Count(r.logs.String(), "NATS connection lost"); n != 1 {
		t.Errorf("%d lines say the link was lost, want 1", n)
	}
	r.wantPinLow()
}

// TestGatewayNoticesSilentLink: a link that goes silent without closing
// (a partition) is noticed within seconds, not nats.go's default minutes:
// /readyz turns 503 within 20 s and calls fail at once instead of each
// waiting out its budget; once the link heals the gateway serves again.
func TestGatewayNoticesSilentLink(t *testing.T) {
	r := startRelayed(t)
	ready := func() int {
		resp, err := http.Get(strings.TrimSuffix(r.gw.url(), "/mcp") + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := ready(); s != http.StatusOK {
		t.Fatalf("/readyz %d before the partition", s)
	}
	r.link.blackhole()
	deadline := time.Now().Add(20 * time.Second)
	for ready() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 20s after the link went silent")
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-t.Context().Done():
			return
		}
	}
	r.wantUnavailable()
	r.link.heal()
	eventually(t, "tools/list listing the device again", r.listsNode)
	r.wantPinLow()
}
