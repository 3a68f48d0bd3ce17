package interop

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// provider is a running oidc.mjs: a real OpenID provider (oidc-provider)
// on a loopback port, which the test asks for tokens and key rotations.
type provider struct {
	p      *nodeProc
	issuer string
}

func startProvider(t *testing.T) *provider {
	t.Helper()
	p := startScript(t, nil, "oidc.mjs")
	var hello struct {
		Issuer string `json:"issuer"`
	}
	p.next(30*time.Second, &hello)
	if !strings.HasPrefix(hello.Issuer, "http://127.0.0.1:") {
		t.Fatalf("oidc.mjs names its issuer %q", hello.Issuer)
	}
	t.Cleanup(p.finish)
	return &provider{p: p, issuer: hello.Issuer}
}

// ask sends one command and decodes its answer, failing on an error.
func (pr *provider) ask(t *testing.T, cmd map[string]string, v any) {
	t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := pr.p.stdin.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Error string `json:"error"`
	}
	var raw json.RawMessage
	pr.p.next(30*time.Second, &raw)
	if err := json.Unmarshal(raw, &out); err != nil || out.Error != "" {
		t.Fatalf("oidc.mjs %v: %s\nstderr:\n%s", cmd, raw, pr.p.stderr)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// token gets an access token for resource from the provider's token
// endpoint, as client (whose tokens carry org = client).
func (pr *provider) token(t *testing.T, client, resource, scope string) string {
	t.Helper()
	var out struct {
		Token string `json:"token"`
	}
	pr.ask(t, map[string]string{"op": "token", "client": client, "resource": resource, "scope": scope}, &out)
	if !jwtRe.MatchString(out.Token) {
		t.Fatalf("oidc.mjs gave %q, not a JWT", out.Token)
	}
	return out.Token
}

// rotate makes the provider sign with a new key, published first in its
// key set.
func (pr *provider) rotate(t *testing.T) string {
	t.Helper()
	var out struct {
		KID string `json:"kid"`
	}
	pr.ask(t, map[string]string{"op": "rotate"}, &out)
	return out.KID
}

// TestOAuthIssuers: okso trusts the tokens of an identity provider it
// did not write, oidc-provider, listed in --oauth-issuers: for the
// audience and the tenants configured, through the official TypeScript
// SDK's client, across a rotation of the provider's key; and refuses the
// tokens of another provider, for another audience, or of a tenant
// outside the allow-list, each with a 401 saying why. okso's own tokens
// keep working beside them.
func TestOAuthIssuers(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs okso and Node")
	}
	idp, other := startProvider(t), startProvider(t)
	const audience = "api://okso-interop"
	file := filepath.Join(t.TempDir(), "issuers.yaml")
	conf := "issuers:\n" +
		"  - name: idp\n" +
		"    issuer: " + idp.issuer + "\n" +
		"    audience: " + audience + "\n" +
		"    tenant_claim: org\n" +
		"    tenants: [" + tenant + ", globex]\n" +
		"    scopes:\n" +
		"      okso.read: tools:call:read_only\n" +
		"      okso.write: tools:call:mutating\n"
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	o := startOkso(t, 1, "--oauth-issuers", file)
	node := o.nodes[0]

	good := idp.token(t, tenant, audience, "okso.read")
	var l listed
	runScript(t, clientEnv(o.mcpURL, good), &l, "list.mjs")
	if got := l.names(); !slices.Contains(got, listedName(echoTool(node))) || slices.Contains(got, listedName(pinWriteTool(node))) {
		t.Errorf("a read-only token of the provider lists %v; want the read-only tools of %s", got, node)
	}
	out := callTools(t, o, good, false, call{echoTool(node), map[string]any{"message": "from the provider"}})
	var echo struct {
		Message string `json:"message"`
	}
	if wantResult(t, "echo", out[0], &echo) && echo.Message != "from the provider" {
		t.Errorf("echo answered %+v", echo)
	}

	t.Run("metadata", func(t *testing.T) {
		resp, err := http.Get(strings.TrimSuffix(o.mcpURL, "/mcp") + "/.well-known/oauth-protected-resource/mcp")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var meta struct {
			AuthorizationServers []string `json:"authorization_servers"`
		}
		// The trusted issuer first (clients take the first), then
		// all-in-one's own authorization server (--oauth-server).
		want := []string{idp.issuer, strings.TrimSuffix(o.mcpURL, "/mcp")}
		if err := json.NewDecoder(resp.Body).Decode(&meta); err != nil || !slices.Equal(meta.AuthorizationServers, want) {
			t.Errorf("authorization_servers %v (%v); want %v", meta.AuthorizationServers, err, want)
		}
	})

	for _, tc := range []struct {
		name, token, why string
	}{
		{"another issuer", other.token(t, tenant, audience, "okso.read"), "its issuer is neither okso nor one of the trusted issuers"},
		{"another audience", idp.token(t, tenant, "api://someone-else", "okso.read"), "it is not meant for this server (its audience is not " + audience + ")"},
		{"a tenant outside the allow-list", idp.token(t, "initech", audience, "okso.read"), "its tenant claim org names a tenant outside the tenants issuer idp is trusted for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := postList(t, o.mcpURL, tc.token)
			if status != http.StatusUnauthorized || !strings.Contains(body, tc.why) {
				t.Errorf("status %d, %q; want 401 saying %q", status, body, tc.why)
			}
		})
	}

	t.Run("rotated key", func(t *testing.T) {
		idp.rotate(t)
		tok := idp.token(t, tenant, audience, "okso.read okso.write")
		var l listed
		runScript(t, clientEnv(o.mcpURL, tok), &l, "list.mjs")
		if !slices.Contains(l.names(), listedName(pinWriteTool(node))) {
			t.Errorf("a token of the new key, mutating, lists %v; want %s among them", l.names(), listedName(pinWriteTool(node)))
		}
		// Tokens of the old key stay good while it is in the key set.
		if status, body := postList(t, o.mcpURL, good); status != http.StatusOK {
			t.Errorf("a token of the old key: %d %s", status, body)
		}
	})

	t.Run("okso tokens too", func(t *testing.T) {
		var l listed
		runScript(t, clientEnv(o.mcpURL, o.token), &l, "list.mjs")
		if !slices.Contains(l.names(), listedName(echoTool(node))) {
			t.Errorf("okso's own token lists %v", l.names())
		}
	})

	t.Run("revoked", func(t *testing.T) {
		tok := idp.token(t, tenant, audience, "okso.read")
		if status, body := postList(t, o.mcpURL, tok); status != http.StatusOK {
			t.Fatalf("before revocation: %d %s", status, body)
		}
		cmd := exec.Command(binary, "token", "revoke", "--nats-url", o.natsURL, "--data-dir", o.dataDir, "--token", tok)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("okso token revoke: %v\n%s", err, b)
		}
		// Revocations reach the gateway within a second (README, Auth):
		// poll as waitListed does, for at most 5 s.
		deadline := time.After(5 * time.Second)
		poll := time.NewTicker(50 * time.Millisecond)
		defer poll.Stop()
		for {
			status, body := postList(t, o.mcpURL, tok)
			if status == http.StatusUnauthorized && strings.Contains(body, "revoked") {
				break
			}
			select {
			case <-deadline:
				t.Fatalf("a revoked token of the provider: %d %s after 5 s", status, body)
			case <-poll.C:
			}
		}
	})
}

// postList posts one tools/list with token and returns the status and
// the body.
func postList(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}
