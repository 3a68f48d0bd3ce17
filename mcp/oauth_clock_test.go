package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
)

// clock is a fake clock the tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// asReplica is one replica of the authorization server, served over
// HTTP at its own URL but with base as its issuer (a public URL).
type asReplica struct {
	s   *OAuthServer
	url string
}

// startAS starts n replicas sharing one bucket, one key and one clock.
func startAS(t *testing.T, n int, clk *clock) (replicas []*asReplica, base string) {
	t.Helper()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	signer, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var first *httptest.Server
	for i := range n {
		nc, err := srv.Connect("replica")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		st, err := bus.OpenOAuth(t.Context(), nc, bus.OAuthOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewOAuthServer(OAuthServerOptions{Store: st, Signer: signer, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		hs := httptest.NewServer(mux)
		t.Cleanup(hs.Close)
		if i == 0 {
			first = hs
		}
		s.routes(mux, func(*http.Request) string { return first.URL })
		replicas = append(replicas, &asReplica{s: s, url: hs.URL})
	}
	return replicas, first.URL
}

var (
	testCodeRe = regexp.MustCompile(`class="code">([A-Z0-9]{4}-[A-Z0-9]{4})<`)
	testCSRFRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
)

// signInAS goes through the flow at replica a, the code redeemed at
// replica b, and returns the last answer's status and, from the token
// endpoint, its body. beforeContinue and beforeRedeem, if set, run
// before those steps.
func signInAS(t *testing.T, a, b *asReplica, base string, beforeContinue, beforeRedeem func()) (int, map[string]any) {
	t.Helper()
	const redirect = "http://127.0.0.1:9/cb"
	resp, err := http.Post(a.url+OAuthRegisterPath, "application/json", strings.NewReader(`{"redirect_uris":["`+redirect+`"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	verifier := strings.Repeat("v", 43)
	sum := sha256.Sum256([]byte(verifier))
	jar, _ := cookiejar.New(nil)
	br := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = br.Get(a.url + OAuthAuthorizePath + "?" + url.Values{
		"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
		"resource": {base + "/mcp"},
	}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	_, _ = page.ReadFrom(resp.Body)
	resp.Body.Close()
	code, csrf := testCodeRe.FindStringSubmatch(page.String()), testCSRFRe.FindStringSubmatch(page.String())
	if code == nil || csrf == nil {
		t.Fatalf("authorize: %s\n%s", resp.Status, page.String())
	}
	uc, _ := NormalizeUserCode(code[1])
	if _, err := DecideOAuthRequest(t.Context(), a.s.o.Store, uc, OAuthDecision{Approved: true, Tenant: "demo", Scope: auth.ScopeReadOnly}); err != nil {
		t.Fatal(err)
	}
	if beforeContinue != nil {
		beforeContinue()
	}
	resp, err = br.PostForm(a.url+OAuthAuthorizePath, url.Values{"request": {code[1]}, "csrf": {csrf[1]}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return resp.StatusCode, nil
	}
	loc, _ := url.Parse(resp.Header.Get("Location"))
	if beforeRedeem != nil {
		beforeRedeem()
	}
	resp, err = http.PostForm(b.url+OAuthTokenPath, url.Values{
		"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "redirect_uri": {redirect},
		"client_id": {reg.ClientID}, "code_verifier": {verifier}, "resource": {base + "/mcp"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	out["client_id"] = reg.ClientID
	return resp.StatusCode, out
}

// A request expires RequestTTL after it was made, a code CodeTTL after
// it was issued, by the server's clock.
func TestOAuthExpiries(t *testing.T) {
	clk := &clock{t: time.Now()}
	rs, base := startAS(t, 1, clk)
	if st, _ := signInAS(t, rs[0], rs[0], base, func() { clk.add(10 * time.Minute) }, nil); st != http.StatusBadRequest {
		t.Errorf("continue on an expired request: %d, want 400", st)
	}
	if st, out := signInAS(t, rs[0], rs[0], base, nil, func() { clk.add(time.Minute) }); st != http.StatusBadRequest || out["error"] != "invalid_grant" {
		t.Errorf("a code redeemed a minute late: %d %v, want 400 invalid_grant", st, out)
	}
	if st, out := signInAS(t, rs[0], rs[0], base, nil, func() { clk.add(59 * time.Second) }); st != http.StatusOK {
		t.Errorf("a code redeemed within its minute: %d %v", st, out)
	}
}

// A grant revoked at one replica is refused at another within
// grantRecheck of its last check there, by the replica's clock.
func TestOAuthGrantRecheck(t *testing.T) {
	clk := &clock{t: time.Now()}
	rs, base := startAS(t, 2, clk)
	st, tok := signInAS(t, rs[0], rs[1], base, nil, nil)
	if st != http.StatusOK {
		t.Fatalf("sign in: %d %v", st, tok)
	}
	access := tok["access_token"].(string)
	for _, r := range rs {
		if _, err := r.s.Verify(t.Context(), access, base); err != nil {
			t.Fatalf("a fresh access token: %v", err)
		}
	}
	c, _ := auth.UnverifiedClaims(access)
	_, grant, _ := subjectGrant(c.Subject)
	if err := rs[0].s.revokeGrant(t.Context(), grant); err != nil {
		t.Fatal(err)
	}
	if _, err := rs[0].s.Verify(t.Context(), access, base); err == nil {
		t.Error("the replica that revoked the grant still accepts its token")
	}
	if _, err := rs[1].s.Verify(t.Context(), access, base); err != nil {
		t.Errorf("the other replica within grantRecheck: %v (it trusts its last check)", err)
	}
	clk.add(grantRecheck)
	if _, err := rs[1].s.Verify(t.Context(), access, base); err == nil {
		t.Error("the other replica after grantRecheck still accepts the revoked grant's token")
	}
	// Another issuer's URL or audience: refused.
	if _, err := rs[1].s.Verify(t.Context(), access, "http://other.example"); err == nil {
		t.Error("a token verified for another gateway URL")
	}
}

// Browser-based clients may discover, register and get tokens from any
// origin; the authorize page, which sets a cookie, is not readable
// cross-origin.
func TestOAuthCORS(t *testing.T) {
	rs, _ := startAS(t, 1, &clock{t: time.Now()})
	for _, path := range []string{OAuthMetadataPath, OAuthJWKSPath, OAuthRegisterPath, OAuthTokenPath, OAuthAuthorizePath} {
		req, _ := http.NewRequest(http.MethodOptions, rs[0].url+path, nil)
		req.Header.Set("Origin", "http://inspector.example")
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "content-type")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		allowed := resp.Header.Get("Access-Control-Allow-Origin") == "*"
		if want := path != OAuthAuthorizePath; allowed != want || want && resp.StatusCode != http.StatusNoContent {
			t.Errorf("preflight of %s: %s, allowed %v, want %v", path, resp.Status, allowed, want)
		}
	}
}

// With Run, a grant revoked at one replica is refused at another as soon
// as the deletion arrives, before grantRecheck has passed.
func TestOAuthRunFollowsRevocations(t *testing.T) {
	clk := &clock{t: time.Now()}
	rs, base := startAS(t, 2, clk)
	gone := make(chan string, 1)
	rs[1].s.goneHook = func(g string) { gone <- g }
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- rs[1].s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	st, tok := signInAS(t, rs[0], rs[1], base, nil, nil)
	if st != http.StatusOK {
		t.Fatalf("sign in: %d %v", st, tok)
	}
	access := tok["access_token"].(string)
	if _, err := rs[1].s.Verify(t.Context(), access, base); err != nil {
		t.Fatal(err)
	}
	c, _ := auth.UnverifiedClaims(access)
	_, grant, _ := subjectGrant(c.Subject)
	if err := rs[0].s.revokeGrant(t.Context(), grant); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-gone:
		if g != grant {
			t.Fatalf("Run saw grant %s go, want %s", g, grant)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run never saw the grant go")
	}
	if _, err := rs[1].s.Verify(t.Context(), access, base); err == nil {
		t.Error("the other replica accepts a revoked grant's token after Run saw it go")
	}
}
