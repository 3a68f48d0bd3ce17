package roles

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkCallPath is one tools/call at a time through the whole of okso
// in this process: an HTTP client, the gateway's fast path, NATS, the
// tier, the WebSocket, a mock device and back. Everything shares this
// process's CPUs, so ns/op is a relative figure (make latency-path splits
// the real path over its processes); allocs/op counts every part,
// the HTTP client's included. Logs (the audit lines among them) are off.
// Its two halves run with each part on NATS as its role, with its
// permissions (the default), and with --nats-insecure: what least
// privilege costs the hot path.
func BenchmarkCallPath(b *testing.B) {
	b.Run("nats=roles", func(b *testing.B) { benchmarkCallPath(b, natsSecurity{}, nil) })
	b.Run("nats=insecure", func(b *testing.B) { benchmarkCallPath(b, natsSecurity{Insecure: true}, nil) })
	// What the metrics cost a call (tracing is off in all three).
	b.Run("nats=roles,metrics", func(b *testing.B) { benchmarkCallPath(b, natsSecurity{}, newProcessRegistry()) })
}

func benchmarkCallPath(b *testing.B, sec natsSecurity, metrics prometheus.Registerer) {
	a, err := NewAllInOne(b.Context(), slog.New(slog.DiscardHandler), AllInOneConfig{
		Gateway:   gatewayConfig{Addr: "127.0.0.1:0", Budget: 5 * time.Second},
		Tier:      tierConfig{Addr: "127.0.0.1:0"},
		DataDir:   b.TempDir(),
		Tenant:    DefaultTenant,
		NATS:      sec,
		telemetry: telemetry{Metrics: metrics},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- a.Run(ctx) }()

	id := wire.NewNodeID()
	tok, err := a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if err != nil {
		b.Fatal(err)
	}
	o := agent.MockOptions(id, a.c.schemas, 1)
	for i := range o.Capabilities {
		o.Capabilities[i].Constraints.RateLimitRPS = 1e5 // the echo's own 10/s would be the figure
	}
	o.URLs, o.Token = []string{a.DeviceURL()}, tok
	d, err := agent.New(o)
	if err != nil {
		b.Fatal(err)
	}
	go func() { done <- d.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		for range 2 {
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				b.Error("all-in-one or the device did not stop")
				return
			}
		}
	})
	wctx, wcancel := context.WithTimeout(b.Context(), 10*time.Second)
	defer wcancel()
	if err := a.gw.gw.Wait(wctx, func(m map[string]int) bool { return m[DefaultTenant] == 1 }); err != nil {
		select {
		case e := <-done:
			b.Fatalf("the gateway never listed the device: %v (%v)", err, e)
		default:
		}
		b.Fatalf("the gateway never listed the device: %v", err)
	}
	agent, err := a.Signer().Mint(auth.MintOptions{Subject: "bench", Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeReadOnly}})
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sysecho.` + id +
		`.echo.invoke","arguments":{"message":"ping"}}}`)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	call := func() {
		req, _ := http.NewRequest(http.MethodPost, a.MCPURL(), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+agent)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte(`"structuredContent":{"message":"ping"`)) {
			b.Fatalf("call: %d %s %v", resp.StatusCode, out, err)
		}
	}
	call() // the first call of a connection
	b.ReportAllocs()
	for b.Loop() {
		call()
	}
}
