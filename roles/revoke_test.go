package roles

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device"
)

// TestRevoke: okso token revoke makes the gateway refuse an agent token and
// the tier drop the session of a device token, within a second or so.
func TestRevoke(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.NATSListen = "127.0.0.1:0" })
	agent := f.token(auth.MintOptions{})
	other := f.token(auth.MintOptions{})
	status := func(tok string) int {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", f.a.MCPURL(),
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
	if s := status(agent); s != 200 {
		t.Fatalf("before revocation: %d", s)
	}
	revoke := func(args ...string) {
		var out bytes.Buffer
		root := NewRoot(&out, &out)
		root.SetArgs(append([]string{"token", "revoke", "--nats-url", f.a.NATSURL()}, args...))
		if err := root.Execute(); err != nil {
			t.Fatalf("revoke: %v\n%s", err, out.String())
		}
	}
	revoke("--token", agent)
	eventually(t, "the gateway refuses the revoked token", func() bool { return status(agent) == http.StatusUnauthorized })
	if s := status(other); s != 200 {
		t.Errorf("another token of the same tenant: %d", s)
	}

	// A device token: its live session is closed with 4401.
	id := device.NewNodeID()
	tok, _ := f.a.Signer().Mint(auth.MintOptions{Subject: id, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})
	o := device.MockOptions(id, f.a.c.schemas, 1)
	o.URLs, o.Token = []string{f.a.DeviceURL()}, tok
	d, _ := device.NewDevice(o)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	f.waitNodes(DefaultTenant, 1)
	claims, _ := auth.UnverifiedClaims(tok)
	revoke(claims.ID)
	var ce *device.CloseError
	if err := <-done; !errors.As(err, &ce) || ce.Code != device.CloseAuthFailed {
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
