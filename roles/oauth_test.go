package roles

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
)

// oauthFixture is an all-in-one whose gateway is okso's authorization
// server too, with a second gateway replica on its NATS: both at one
// public URL (a load balancer's), so a flow may hop between them.
type oauthFixture struct {
	*fixture
	base     string // the public URL: replica A's address
	replicaB string // replica B's own address (http://host:port)
}

func startOAuth(t *testing.T, edit func(*oauthConfig)) *oauthFixture {
	t.Helper()
	// Replica A's address is chosen first, to be the public URL of both.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	base := "http://" + addr
	oc := oauthConfig{Server: true}
	if edit != nil {
		edit(&oc)
	}
	f := startAllInOne(t, 1, func(c *AllInOneConfig) {
		c.NATSListen = "127.0.0.1:0"
		c.Gateway.Addr, c.Gateway.PublicURL, c.Gateway.OAuth = addr, base, oc
	})
	c, err := loadCommon(slog.New(slog.DiscardHandler), f.a.nats.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newGatewayPart(t.Context(), c, f.a.nats, gatewayConfig{
		Addr: "127.0.0.1:0", Budget: 5 * time.Second, PublicURL: base, OAuth: oc,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runGroup(ctx, b.actors) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica B: %v", err)
		}
		b.close()
	})
	return &oauthFixture{fixture: f, base: base, replicaB: "http://" + b.http.addr()}
}

// oauthCLI runs okso oauth with args against the fixture's NATS.
func (f *oauthFixture) oauthCLI(args ...string) (string, error) {
	var out bytes.Buffer
	root := NewRoot(&out, &out)
	root.SetArgs(append(append([]string{"oauth"}, args...), "--nats-url", f.a.NATSURL(), "--data-dir", f.a.nats.dataDir))
	err := root.ExecuteContext(f.t.Context())
	return out.String(), err
}

// browser is a user agent: it keeps cookies and never follows redirects
// (the test reads where they lead).
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// pkce is a verifier and its S256 challenge.
func pkce(seed string) (verifier, challenge string) {
	verifier = strings.Repeat(seed, 43/len(seed)+1)[:43]
	sum := sha256.Sum256([]byte(verifier))
	return verifier, base64.RawURLEncoding.EncodeToString(sum[:])
}

func (f *oauthFixture) register(redirects ...string) string {
	f.t.Helper()
	body, _ := json.Marshal(map[string]any{"redirect_uris": redirects, "client_name": "okso test client", "token_endpoint_auth_method": "none"})
	resp, err := http.Post(f.base+"/oauth/register", "application/json", bytes.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		ClientID string `json:"client_id"`
		Method   string `json:"token_endpoint_auth_method"`
	}
	if resp.StatusCode != http.StatusCreated || json.NewDecoder(resp.Body).Decode(&out) != nil || out.ClientID == "" || out.Method != "none" {
		f.t.Fatalf("register: %s, %+v", resp.Status, out)
	}
	return out.ClientID
}

var (
	userCodeRe = regexp.MustCompile(`class="code">([A-Z0-9]{4}-[A-Z0-9]{4})<`)
	csrfRe     = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// authorize opens the authorize page with params and returns the
// request's user code and CSRF token (the page's), or the response when
// the page was not shown.
func (f *oauthFixture) authorize(b *http.Client, params url.Values) (code, csrf string, resp *http.Response) {
	f.t.Helper()
	resp, err := b.Get(f.base + "/oauth/authorize?" + params.Encode())
	if err != nil {
		f.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", resp
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		f.t.Errorf("authorize page CSP %q", csp)
	}
	if strings.Contains(strings.ToLower(string(body)), `type="password"`) {
		f.t.Error("the authorize page asks for a secret")
	}
	m, n := userCodeRe.FindSubmatch(body), csrfRe.FindSubmatch(body)
	if m == nil || n == nil {
		f.t.Fatalf("authorize page without a code or CSRF token:\n%s", body)
	}
	return string(m[1]), string(n[1]), resp
}

// cont presses Continue on the page of the request code.
func (f *oauthFixture) cont(b *http.Client, code, csrf string) *http.Response {
	f.t.Helper()
	resp, err := b.PostForm(f.base+"/oauth/authorize", url.Values{"request": {code}, "csrf": {csrf}, "action": {"continue"}})
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// tokenAt posts a token request to a replica and decodes its answer.
func tokenAt(t *testing.T, replica string, form url.Values) (int, map[string]any) {
	t.Helper()
	resp, err := http.PostForm(replica+"/oauth/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("token answer %s is not JSON: %v", resp.Status, err)
	}
	return resp.StatusCode, out
}

func wantOAuthError(t *testing.T, what string, status int, out map[string]any, wantStatus int, code string) {
	t.Helper()
	if status != wantStatus || out["error"] != code {
		t.Errorf("%s: %d %v, want %d %s", what, status, out, wantStatus, code)
	}
}

// mcpStatus is the status /mcp at replica answers a tools/list with token.
func mcpStatus(t *testing.T, replica, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, replica+"/mcp",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// The whole flow, by hand, hopping between replicas: discovery,
// registration, the page, the operator's approval, the code redeemed at
// replica B, a tool listed with the token at A, a refresh at B; then
// the replayed code and the reused refresh token revoke the grant.
func TestOAuthServerFlow(t *testing.T) {
	f := startOAuth(t, nil)
	// Discovery: the resource lists its authorization server, itself.
	var prm struct {
		Resource string   `json:"resource"`
		AS       []string `json:"authorization_servers"`
	}
	getJSON(t, f.base+"/.well-known/oauth-protected-resource/mcp", &prm)
	if prm.Resource != f.base+"/mcp" || len(prm.AS) != 1 || prm.AS[0] != f.base {
		t.Fatalf("protected-resource metadata %+v", prm)
	}
	var asm map[string]any
	getJSON(t, f.base+"/.well-known/oauth-authorization-server", &asm)
	if asm["issuer"] != f.base || fmt.Sprint(asm["code_challenge_methods_supported"]) != "[S256]" ||
		fmt.Sprint(asm["token_endpoint_auth_methods_supported"]) != "[none]" || asm["authorization_response_iss_parameter_supported"] != true {
		t.Fatalf("authorization server metadata %v", asm)
	}

	const redirect = "http://127.0.0.1:7777/callback"
	client := f.register(redirect)
	verifier, challenge := pkce("verifier-1")
	params := url.Values{
		"response_type": {"code"}, "client_id": {client}, "redirect_uri": {redirect},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"},
		"resource": {f.base + "/mcp"}, "state": {"st-1"}, "scope": {auth.ScopeReadOnly},
	}
	b := browser(t)
	code, csrf, resp := f.authorize(b, params)
	if code == "" {
		t.Fatalf("authorize: %s", resp.Status)
	}
	if out, err := f.oauthCLI("list"); err != nil || !strings.Contains(out, "pending "+code+` client "okso test client"`) {
		t.Errorf("okso oauth list does not show the pending request %s: %v\n%s", code, err, out)
	}
	// Before the operator approves, Continue shows the page again.
	if resp := f.cont(b, code, csrf); resp.StatusCode != http.StatusOK {
		t.Fatalf("continue before approval: %s", resp.Status)
	}
	// A POST without the page's CSRF token is refused.
	if resp := f.cont(browser(t), code, csrf); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("continue from another browser (no cookie): %s, want 403", resp.Status)
	}
	if out, err := f.oauthCLI("approve", code, "--tenant", DefaultTenant, "--scope", auth.ScopeReadOnly); err != nil {
		t.Fatalf("okso oauth approve: %v\n%s", err, out)
	} else if !strings.Contains(out, "okso test client") {
		t.Errorf("approve does not name the client: %s", out)
	}
	resp = f.cont(b, code, csrf)
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusSeeOther || loc == nil || loc.Query().Get("code") == "" ||
		loc.Query().Get("state") != "st-1" || loc.Query().Get("iss") != f.base {
		t.Fatalf("continue after approval: %s, Location %q", resp.Status, resp.Header.Get("Location"))
	}
	authCode := loc.Query().Get("code")
	// Pressed again: the request is used.
	if resp := f.cont(b, code, csrf); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("continue twice: %s, want 400", resp.Status)
	}

	redeem := url.Values{
		"grant_type": {"authorization_code"}, "code": {authCode}, "redirect_uri": {redirect},
		"client_id": {client}, "code_verifier": {verifier}, "resource": {f.base + "/mcp"},
	}
	// Hostile redemptions first: none of them spends the code.
	for _, bad := range []struct {
		name, key, value string
		code             string
	}{
		{"no verifier", "code_verifier", "", "invalid_request"},
		{"wrong verifier", "code_verifier", strings.Repeat("x", 43), "invalid_grant"},
		{"plain verifier (the challenge itself)", "code_verifier", challenge, "invalid_grant"},
		{"short verifier", "code_verifier", "abc", "invalid_request"},
		{"no resource", "resource", "", "invalid_request"},
		{"another resource", "resource", "https://evil.example/mcp", "invalid_target"},
		{"another redirect", "redirect_uri", "http://127.0.0.1:7777/other", "invalid_grant"},
	} {
		form := url.Values{}
		for k, v := range redeem {
			form[k] = v
		}
		form.Set(bad.key, bad.value)
		st, out := tokenAt(t, f.replicaB, form)
		wantOAuthError(t, bad.name, st, out, http.StatusBadRequest, bad.code)
	}
	st, tok := tokenAt(t, f.replicaB, redeem)
	if st != http.StatusOK || tok["access_token"] == nil || tok["refresh_token"] == nil || tok["token_type"] != "Bearer" {
		t.Fatalf("redeem at replica B: %d %v", st, tok)
	}
	access, refresh := tok["access_token"].(string), tok["refresh_token"].(string)
	c, err := auth.UnverifiedClaims(access)
	if err != nil {
		t.Fatal(err)
	}
	if c.Issuer != f.base || !strings.HasPrefix(c.Subject, "oauth:"+client+":") || c.Tenant != DefaultTenant ||
		len(c.Audience) != 1 || c.Audience[0] != f.base+"/mcp" || c.ID == "" {
		t.Fatalf("access token claims %+v", c)
	}
	// A tool call's door at replica A takes it; the refresh token is no
	// bearer token.
	if s := mcpStatus(t, f.base, access); s != http.StatusOK {
		t.Fatalf("/mcp with the access token: %d", s)
	}
	sess := f.client(access, "")
	if res, err := sess.ListTools(t.Context(), nil); err != nil || len(res.Tools) == 0 {
		t.Fatalf("tools/list with the OAuth token: %v, %v", res, err)
	}
	if s := mcpStatus(t, f.base, refresh); s != http.StatusUnauthorized {
		t.Errorf("/mcp with the refresh token: %d, want 401", s)
	}

	// Refresh at replica B: a new pair.
	rf := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {client}, "resource": {f.base + "/mcp"}}
	st, tok2 := tokenAt(t, f.replicaB, rf)
	if st != http.StatusOK || tok2["refresh_token"] == refresh {
		t.Fatalf("refresh: %d %v", st, tok2)
	}
	access2, refresh2 := tok2["access_token"].(string), tok2["refresh_token"].(string)
	if s := mcpStatus(t, f.replicaB, access2); s != http.StatusOK {
		t.Fatalf("/mcp with the refreshed token: %d", s)
	}
	// The spent refresh token again, at A: the family is revoked.
	st, out := tokenAt(t, f.base, rf)
	wantOAuthError(t, "reused refresh token", st, out, http.StatusBadRequest, "invalid_grant")
	st, out = tokenAt(t, f.replicaB, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh2}, "client_id": {client}})
	wantOAuthError(t, "the family's newest refresh token after a reuse", st, out, http.StatusBadRequest, "invalid_grant")
	if s := mcpStatus(t, f.base, access2); s != http.StatusUnauthorized {
		t.Errorf("/mcp at the replica that revoked the grant, with its access token: %d, want 401", s)
	}
	// The other replica hears of it at once (grantRecheck is 10 s).
	eventually(t, "the other replica refuses the revoked grant's access token", func() bool {
		return mcpStatus(t, f.replicaB, access2) == http.StatusUnauthorized
	})
	// The code again, at either replica: refused.
	for _, replica := range []string{f.base, f.replicaB} {
		st, out = tokenAt(t, replica, redeem)
		wantOAuthError(t, "replayed code at "+replica, st, out, http.StatusBadRequest, "invalid_grant")
	}
	// Replica A's audit: the grant, and its revocation for the reuse,
	// on the tenant's subject.
	eventually(t, "audit events of the grant's life", func() bool {
		logs := f.logs.String()
		return strings.Contains(logs, `"code":"oauth_refresh_reused"`) && strings.Contains(logs, `"subject":"oauth:`+client+`:`)
	})
}

// A replayed code revokes the grant the first redemption made, at the
// other replica too.
func TestOAuthCodeReplayRevokes(t *testing.T) {
	f := startOAuth(t, nil)
	const redirect = "http://127.0.0.1:7777/cb"
	client := f.register(redirect)
	access, refresh, redeem := f.signIn(client, redirect)
	st, out := tokenAt(t, f.base, redeem) // replica A; B redeemed it
	wantOAuthError(t, "replayed code", st, out, http.StatusBadRequest, "invalid_grant")
	if s := mcpStatus(t, f.base, access); s != http.StatusUnauthorized {
		t.Errorf("/mcp with the replayed code's access token: %d, want 401", s)
	}
	st, out = tokenAt(t, f.replicaB, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {client}})
	wantOAuthError(t, "refresh of the replayed code's grant", st, out, http.StatusBadRequest, "invalid_grant")
}

// signIn goes through the flow for client and returns the tokens, and
// the redemption (redeemed at replica B).
func (f *oauthFixture) signIn(client, redirect string) (access, refresh string, redeem url.Values) {
	f.t.Helper()
	verifier, challenge := pkce("v")
	b := browser(f.t)
	code, csrf, resp := f.authorize(b, url.Values{
		"response_type": {"code"}, "client_id": {client}, "redirect_uri": {redirect},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "resource": {f.base + "/mcp"},
	})
	if code == "" {
		f.t.Fatalf("authorize: %s", resp.Status)
	}
	if out, err := f.oauthCLI("approve", code, "--tenant", DefaultTenant, "--scope", auth.ScopeReadOnly); err != nil {
		f.t.Fatalf("approve: %v %s", err, out)
	}
	resp = f.cont(b, code, csrf)
	loc, _ := url.Parse(resp.Header.Get("Location"))
	redeem = url.Values{
		"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirect},
		"client_id": {client}, "code_verifier": {verifier}, "resource": {f.base + "/mcp"},
	}
	st, tok := tokenAt(f.t, f.replicaB, redeem)
	if st != http.StatusOK {
		f.t.Fatalf("redeem: %d %v", st, tok)
	}
	return tok["access_token"].(string), tok["refresh_token"].(string), redeem
}

// Hostile authorization requests are refused on the page, never
// redirected to the client's redirect URI (registered or not): that
// waits for the user's Continue or Cancel.
func TestOAuthAuthorizeRefusals(t *testing.T) {
	f := startOAuth(t, nil)
	const redirect = "http://127.0.0.1:7777/cb"
	client := f.register(redirect)
	_, challenge := pkce("z")
	good := url.Values{
		"response_type": {"code"}, "client_id": {client}, "redirect_uri": {redirect},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "resource": {f.base + "/mcp"}, "state": {"s"},
	}
	for _, tc := range []struct {
		name, key, value string
		status           int
	}{
		{"wrong redirect URI", "redirect_uri", "https://evil.example/cb", http.StatusBadRequest},
		{"another path on loopback", "redirect_uri", "http://127.0.0.1:7777/evil", http.StatusBadRequest},
		{"unknown client", "client_id", "cnosuchclient", http.StatusBadRequest},
		{"missing PKCE", "code_challenge", "", http.StatusBadRequest},
		{"plain PKCE", "code_challenge_method", "plain", http.StatusBadRequest},
		{"missing resource", "resource", "", http.StatusBadRequest},
		{"another resource", "resource", "https://evil.example/mcp", http.StatusBadRequest},
		{"token response type", "response_type", "token", http.StatusBadRequest},
		{"unknown scope", "scope", "admin", http.StatusBadRequest},
		{"loopback port of its choosing", "redirect_uri", "http://127.0.0.1:4242/cb", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := url.Values{}
			for k, v := range good {
				params[k] = v
			}
			params.Set(tc.key, tc.value)
			_, _, resp := f.authorize(browser(t), params)
			if resp.StatusCode != tc.status {
				t.Fatalf("%s: %s, want %d", tc.name, resp.Status, tc.status)
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Fatalf("redirected to %s", loc)
			}
		})
	}
}

// The operator denies: the client gets access_denied.
func TestOAuthDeny(t *testing.T) {
	f := startOAuth(t, nil)
	const redirect = "http://127.0.0.1:7777/cb"
	client := f.register(redirect)
	_, challenge := pkce("d")
	b := browser(t)
	code, csrf, _ := f.authorize(b, url.Values{
		"response_type": {"code"}, "client_id": {client}, "redirect_uri": {redirect},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "resource": {f.base + "/mcp"},
	})
	if out, err := f.oauthCLI("deny", code); err != nil {
		t.Fatalf("deny: %v %s", err, out)
	}
	resp := f.cont(b, code, csrf)
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if loc == nil || loc.Query().Get("error") != "access_denied" {
		t.Fatalf("after deny: %s %s", resp.Status, resp.Header.Get("Location"))
	}
	if out, err := f.oauthCLI("approve", "BBBB-2222", "--tenant", "demo", "--scope", auth.ScopeReadOnly); err == nil {
		t.Fatalf("approve of no request: %s", out)
	}
}

// okso oauth revoke: a grant's refresh token fails at once, its access
// token through the revocations; a client removed gets 401
// invalid_client, which tells a host to register again.
func TestOAuthRevoke(t *testing.T) {
	f := startOAuth(t, nil)
	const redirect = "http://127.0.0.1:7777/cb"
	client := f.register(redirect)
	access, refresh, _ := f.signIn(client, redirect)
	c, _ := auth.UnverifiedClaims(access)
	grant := c.Subject[strings.LastIndexByte(c.Subject, ':')+1:]
	if out, err := f.oauthCLI("revoke", grant); err != nil {
		t.Fatalf("revoke: %v %s", err, out)
	}
	// The jti reaches every replica through okso_revoked.
	eventually(t, "the gateway refuses the revoked grant's access token", func() bool {
		return mcpStatus(t, f.base, access) == http.StatusUnauthorized
	})
	st, out := tokenAt(t, f.base, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {client}})
	wantOAuthError(t, "refresh of a revoked grant", st, out, http.StatusBadRequest, "invalid_grant")

	if out, err := f.oauthCLI("revoke", "--client", client); err != nil {
		t.Fatalf("revoke --client: %v %s", err, out)
	}
	st, out = tokenAt(t, f.base, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refresh}, "client_id": {client}})
	wantOAuthError(t, "a removed client", st, out, http.StatusUnauthorized, "invalid_client")
}

// Client ID Metadata Documents: fetched over https, with no redirect,
// from public addresses only (the test's server is admitted on
// 127.0.0.1 by the test-only flag, and refused without it).
func TestOAuthClientMetadataDocument(t *testing.T) {
	const redirect = "http://127.0.0.1:7777/cb"
	mux := http.NewServeMux()
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	docURL := srv.URL + "/client.json"
	mux.HandleFunc("/client.json", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"client_id": docURL, "client_name": "cimd test client",
			"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none"})
	})
	mux.HandleFunc("/moved.json", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/client.json", http.StatusFound)
	})
	mux.HandleFunc("/big.json", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write(bytes.Repeat([]byte(" "), 6<<10))
	})
	trust := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()

	f := startOAuth(t, func(c *oauthConfig) { c.CIMDAllowLoopback, c.CIMDTLS = true, trust })
	_, challenge := pkce("c")
	params := func(client string) url.Values {
		return url.Values{"response_type": {"code"}, "client_id": {client}, "redirect_uri": {redirect},
			"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "resource": {f.base + "/mcp"}}
	}
	if code, _, resp := f.authorize(browser(t), params(docURL)); code == "" {
		t.Fatalf("a metadata document's client: %s", resp.Status)
	}
	for _, bad := range []string{srv.URL + "/moved.json", srv.URL + "/big.json", strings.Replace(docURL, "https:", "http:", 1)} {
		if code, _, resp := f.authorize(browser(t), params(bad)); code != "" || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("client %s: %s, want 400", bad, resp.Status)
		}
	}
	// Without the test-only flag, 127.0.0.1 is refused at dial time.
	g := startOAuth(t, func(c *oauthConfig) { c.CIMDTLS = trust })
	if code, _, resp := g.authorize(browser(t), params(docURL)); code != "" || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a metadata document on 127.0.0.1: %s, want 400", resp.Status)
	}
}

// Registration is capped in number.
func TestOAuthRegistrationCap(t *testing.T) {
	f := startOAuth(t, func(c *oauthConfig) { c.MaxClients = 2 })
	f.register("http://127.0.0.1:1/cb")
	f.register("http://127.0.0.1:1/cb")
	body := `{"redirect_uris":["http://127.0.0.1:1/cb"]}`
	resp, err := http.Post(f.base+"/oauth/register", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a third client with a cap of 2: %s", resp.Status)
	}
	for _, bad := range []string{`{"redirect_uris":["javascript:alert(1)"]}`, `{"redirect_uris":["http://evil.example/cb"]}`, `{}`, `not json`} {
		resp, err := http.Post(f.base+"/oauth/register", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusForbidden {
			t.Errorf("register %s: %s", bad, resp.Status)
		}
	}
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
}
