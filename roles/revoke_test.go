package roles

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	deviceagent "github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
)

// listStatus is the HTTP status of a tools/list with tok at the gateway url.
func listStatus(t *testing.T, url, tok string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url,
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// revokeAt runs okso token revoke with args at a's NATS, with the
// admin's credential in a's data dir.
func revokeAt(t *testing.T, a *AllInOne, args ...string) {
	t.Helper()
	var out bytes.Buffer
	root := NewRoot(&out, &out)
	root.SetArgs(append([]string{"token", "revoke", "--nats-url", a.NATSURL(), "--data-dir", a.nats.dataDir}, args...))
	if err := root.Execute(); err != nil {
		t.Fatalf("revoke: %v\n%s", err, out.String())
	}
}

// TestRevoke: okso token revoke makes the gateway refuse an agent token and
// the tier drop the session of a device token, within a second or so.
func TestRevoke(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.NATSListen = "127.0.0.1:0" })
	agent := f.token(auth.MintOptions{})
	other := f.token(auth.MintOptions{})
	status := func(tok string) int { return listStatus(t, f.a.MCPURL(), tok) }
	if s := status(agent); s != 200 {
		t.Fatalf("before revocation: %d", s)
	}
	revoke := func(args ...string) { revokeAt(t, f.a, args...) }
	revoke("--token", agent)
	eventually(t, "the gateway refuses the revoked token", func() bool { return status(agent) == http.StatusUnauthorized })
	if s := status(other); s != 200 {
		t.Errorf("another token of the same tenant: %d", s)
	}

	// A device token: its live session is closed with 4401.
	id := wire.NewNodeID()
	tok, _ := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	o := deviceagent.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token = []string{f.a.DeviceURL()}, tok
	d, _ := deviceagent.New(o)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	f.waitNodes(DefaultTenant, 1)
	claims, _ := auth.UnverifiedClaims(tok)
	revoke(claims.ID)
	var ce *deviceagent.CloseError
	if err := <-done; !errors.As(err, &ce) || ce.Code != wire.CloseAuthFailed {
		t.Fatalf("device after revocation: %v, want close 4401", err)
	}
	f.waitNodes(DefaultTenant, 0)
	// Each role's auditor writes on its own goroutine: wait for both lines.
	eventually(t, "revoked audit events of the gateway and the tier", func() bool {
		logs := f.logs.String()
		return strings.Contains(logs, `"actor":"gateway","tenant":"demo","subject"`) &&
			strings.Contains(logs, `"actor":"tier","tenant":"demo","subject"`) &&
			strings.Count(logs, `"decision":"revoked"`) >= 2
	})
}

// TestRevocationsSurviveRestart: revocations are on disk, in the store of
// the embedded NATS server under the data dir. All-in-one, the process
// that hosts NATS, stops and starts again on the same data dir: from its
// first request on, a revoked agent token gets 401 at the gateway and a
// revoked device token 4401 at the tier, while a fresh token works.
func TestRevocationsSurviveRestart(t *testing.T) {
	dataDir := t.TempDir()
	cfg := func(c *AllInOneConfig) { c.NATSListen, c.DataDir = "127.0.0.1:0", dataDir }
	f := startAllInOne(t, 0, cfg)
	agent := f.token(auth.MintOptions{})
	dev, _ := f.a.Signer().Mint(auth.MintOptions{Subject: wire.NewNodeID(), Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	if code, _ := tierAuth(t, f.a.DeviceURL(), dev, false); code != wire.TypeAuthOK {
		t.Fatalf("device token before revocation: %s", code)
	}
	revokeAt(t, f.a, "--token", agent)
	revokeAt(t, f.a, "--token", dev)
	eventually(t, "the gateway refuses the revoked token", func() bool {
		return listStatus(t, f.a.MCPURL(), agent) == http.StatusUnauthorized
	})
	eventually(t, "the tier refuses the revoked device token", func() bool {
		code, _ := tierAuth(t, f.a.DeviceURL(), dev, false)
		return code == "4401"
	})
	name := f.a.nats.name
	f.stop()

	f = startAllInOne(t, 0, cfg)
	if f.a.nats.name != name {
		t.Errorf("NATS server name %s after the restart, was %s: its store is another", f.a.nats.name, name)
	}
	if s := listStatus(t, f.a.MCPURL(), agent); s != http.StatusUnauthorized {
		t.Errorf("revoked agent token after the restart: HTTP %d, want 401", s)
	}
	if code, _ := tierAuth(t, f.a.DeviceURL(), dev, false); code != "4401" {
		t.Errorf("revoked device token after the restart: %s, want close 4401", code)
	}
	if s := listStatus(t, f.a.MCPURL(), f.token(auth.MintOptions{})); s != http.StatusOK {
		t.Errorf("a fresh token after the restart: HTTP %d", s)
	}
}

// TestNATSStore: roles that share a data dir get NATS names and stores of
// their own, kept across restarts; a second process of one role on the
// same data dir is refused, and so is a name that cannot name a directory.
func TestNATSStore(t *testing.T) {
	dir := t.TempDir()
	open := func(c natsConfig) (*natsPart, error) {
		c.DataDir = dir
		np, err := openNATS(t.Context(), c)
		if err == nil {
			t.Cleanup(np.close)
		}
		return np, err
	}
	gw, err := open(natsConfig{Role: "gateway"})
	if err != nil {
		t.Fatal(err)
	}
	tier, err := open(natsConfig{Role: "device"})
	if err != nil {
		t.Fatal(err)
	}
	if gw.name == tier.name || gw.store == tier.store {
		t.Errorf("gateway and device share NATS name or store: %s %s, %s %s", gw.name, gw.store, tier.name, tier.store)
	}
	if want := filepath.Join(dir, "nats", tier.name); tier.store != want {
		t.Errorf("store %s, want %s", tier.store, want)
	}
	if _, err := open(natsConfig{Role: "device"}); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Errorf("a second device tier on the same data dir: %v, want refused", err)
	}
	named, err := open(natsConfig{Role: "device", Name: "n2"})
	if err != nil {
		t.Fatalf("a second device tier with its own --nats-name: %v", err)
	}
	if named.store != filepath.Join(dir, "nats", "n2") {
		t.Errorf("store of n2: %s", named.store)
	}
	name := tier.name
	tier.close()
	again, err := open(natsConfig{Role: "device"})
	if err != nil {
		t.Fatal(err)
	}
	if again.name != name {
		t.Errorf("device restarted as %s, was %s", again.name, name)
	}
	for _, bad := range []string{"../x", "a b", "a/b", ".hidden"} {
		if _, err := open(natsConfig{Role: "device", Name: bad}); err == nil || !strings.Contains(err.Error(), "--nats-name") {
			t.Errorf("--nats-name %q: %v, want refused", bad, err)
		}
	}
}

// TestOpenNATSRefusesHalfClusters: a cluster member without a client
// listener, or without routes, is refused at once with the flag it needs
// (nats-server would never get ready, and then never stop).
func TestOpenNATSRefusesHalfClusters(t *testing.T) {
	for _, tc := range []struct {
		c    natsConfig
		want string
	}{
		{natsConfig{Cluster: "okso", Addr: "127.0.0.1:0", Routes: []string{"nats-route://127.0.0.1:1"}}, "needs --nats-listen"},
		{natsConfig{Cluster: "okso", Addr: "127.0.0.1:0", Listen: "127.0.0.1:0"}, "needs --nats-routes"},
	} {
		tc.c.DataDir, tc.c.Role = t.TempDir(), "device"
		done := make(chan error, 1)
		go func() {
			np, err := openNATS(t.Context(), tc.c)
			if err == nil {
				np.close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want an error that %s", tc.c, err, tc.want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%+v: openNATS hangs", tc.c)
		}
	}
}
