package roles

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// TestNoSilentUnlisting: every way an upstream's or a caller's tools
// leave the catalog is said once, with the source and the reason, at the
// level the reason has (warn for a lease that lapsed, a record or a tool
// refused), and counted.
func TestNoSilentUnlisting(t *testing.T) {
	logs := &syncBuffer{}
	f := startAllInOneLog(t, 0, nil, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), logs)
	gw := f.a.gw.gw
	counted := func(t *testing.T, key string, n int64) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := gw.Wait(ctx, func(map[string]int) bool { return gw.Catalog().Unlisted()[key] >= n }); err != nil {
			t.Fatalf("%s counted %d times, want %d (%v)", key, gw.Catalog().Unlisted()[key], n, gw.Catalog().Unlisted())
		}
		if got := gw.Catalog().Unlisted()[key]; got != n {
			t.Errorf("%s counted %d times, want %d", key, got, n)
		}
	}
	said := func(t *testing.T, level, msg, attr, value string) {
		t.Helper()
		for line := range strings.Lines(logs.String()) {
			var l map[string]any
			if json.Unmarshal([]byte(line), &l) == nil && l["level"] == level && l["msg"] == msg && strings.Contains(strings.Join(strings.Fields(line), " "), value) && l[attr] != nil {
				return
			}
		}
		t.Errorf("no %s line %q with %s %s in the log", level, msg, attr, value)
	}
	obj := json.RawMessage(`{"type":"object"}`)
	record := func(upstream string, tools ...bus.RemoteTool) *bus.Remote {
		return &bus.Remote{Upstream: upstream, Transport: "stdio", Tenants: []string{DefaultTenant}, TimeoutMs: 2000, Tools: tools}
	}
	tool := func(name string, schema json.RawMessage) bus.RemoteTool {
		return bus.RemoteTool{Name: name, InputSchema: schema, Safety: schemas.SafetyReadOnly}
	}

	t.Run("an upstream's lease lapses", func(t *testing.T) {
		leased, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		f.putRemote(leased, record("lapse", tool("t", obj)), DefaultTenant, "lapse.t", true)
		f.waitTool(DefaultTenant, "lapse.t", false)
		counted(t, "upstream/its lease lapsed", 1)
		said(t, "WARN", "upstream tools unlisted: its lease lapsed", "upstream", "lapse")
	})

	remotes, err := bus.OpenRemotes(t.Context(), f.nc, bus.RemotesOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("an upstream lists fewer tools, one refused", func(t *testing.T) {
		f.putRemote(remotes, record("up", tool("a", obj), tool("b", obj)), DefaultTenant, "up.b", true)
		f.putRemote(remotes, record("up", tool("a", obj), tool("bomb", json.RawMessage(schemaBomb(20)))), DefaultTenant, "up.b", false)
		counted(t, "upstream/no longer listed by its owner", 1)
		said(t, "INFO", "upstream tools unlisted: no longer listed by its owner", "tools", "b")
		counted(t, "upstream/a tool was refused", 1)
		said(t, "WARN", "upstream tools unlisted: a tool was refused", "err", "expansion bound")
	})
	t.Run("an upstream is released", func(t *testing.T) {
		rec := record("rel", tool("t", obj))
		rev := f.putRemote(remotes, rec, DefaultTenant, "rel.t", true)
		if err := remotes.Release(t.Context(), "rel", rev); err != nil {
			t.Fatal(err)
		}
		f.waitTool(DefaultTenant, "rel.t", false)
		counted(t, "upstream/removed by its owner", 1)
		said(t, "INFO", "upstream tools unlisted: removed by its owner", "upstream", "rel")
	})
	t.Run("a record okso did not write", func(t *testing.T) {
		js, err := jetstream.New(f.nc)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := js.KeyValue(t.Context(), bus.BucketRemotes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(t.Context(), "junk", []byte(`{"upstream":"other"}`)); err != nil {
			t.Fatal(err)
		}
		counted(t, "upstream/its record was refused", 1)
		said(t, "WARN", "upstream tools unlisted: its record was refused", "upstream", "junk")
	})

	t.Run("a device disconnects", func(t *testing.T) {
		_, stop := f.connectDevice(DefaultTenant, nil)
		f.waitNodes(DefaultTenant, 1)
		stop()
		f.waitNodes(DefaultTenant, 0)
		counted(t, "device/disconnected", 1)
	})

	t.Run("a listen ends, or is replaced", func(t *testing.T) {
		tok := f.token(auth.MintOptions{Subject: "agent-a", Scopes: []string{auth.ScopeMutating}})
		first := f.listen(f.a.MCPURL(), tok, twoTools)
		waitTool(t, gw, DefaultTenant, "a_send", true)
		second := f.listen(f.a.MCPURL(), tok, twoTools)
		// The holder learns of its own declaration from the bucket's
		// watch, which may come after the listen said it is ready.
		wctx, wcancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer wcancel()
		if err := gw.Wait(wctx, func(map[string]int) bool { return gw.Listens().Of(DefaultTenant, "a") == second.id }); err != nil {
			t.Fatal("the second listen does not hold the tools")
		}
		<-first.done
		second.stop()
		waitTool(t, gw, DefaultTenant, "a_send", false)
		// The first listen's tools left when the second's declaration came
		// (replaced), or when the first removed its own, whichever the
		// gateway saw first: said either way, and once; the second's when
		// it removed its own.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		both := func() int64 {
			u := gw.Catalog().Unlisted()
			return u["caller/replaced by a newer listen"] + u["caller/removed by its owner"]
		}
		if err := gw.Wait(ctx, func(map[string]int) bool { return both() >= 2 }); err != nil || both() != 2 {
			t.Errorf("two listens unlisted %v, want the first replaced or removed, the second removed", gw.Catalog().Unlisted())
		}
		said(t, "INFO", "caller tools unlisted: removed by its owner", "listen_id", second.id)
	})
}
