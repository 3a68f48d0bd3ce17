package mcp

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
)

// refreshAS presents a refresh token of client at replica a.
func refreshAS(t *testing.T, a *asReplica, base, clientID, rt string) (int, map[string]any) {
	t.Helper()
	resp, err := http.PostForm(a.url+OAuthTokenPath, url.Values{
		"grant_type": {"refresh_token"}, "refresh_token": {rt}, "client_id": {clientID}, "resource": {base + "/mcp"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestOAuthRefreshReuseAfterManyRotations: a refresh token spent however
// many rotations ago still revokes its grant when presented again, so a
// thief who rotates a stolen token often cannot outrun the victim's
// reuse.
func TestOAuthRefreshReuseAfterManyRotations(t *testing.T) {
	clk := &clock{t: time.Now()}
	rs, base := startAS(t, 1, clk)
	st, tok := signInAS(t, rs[0], rs[0], base, nil, nil)
	if st != http.StatusOK {
		t.Fatalf("sign in: %d %v", st, tok)
	}
	client := tok["client_id"].(string)
	victim := tok["refresh_token"].(string)
	stolen := victim
	for range 40 {
		st, out := refreshAS(t, rs[0], base, client, stolen)
		if st != http.StatusOK {
			t.Fatalf("thief's rotation: %d %v", st, out)
		}
		stolen = out["refresh_token"].(string)
	}
	if st, out := refreshAS(t, rs[0], base, client, victim); st != http.StatusBadRequest || out["error"] != oauthInvalidGrant {
		t.Errorf("victim's reuse: %d %v, want 400 invalid_grant", st, out)
	}
	if st, out := refreshAS(t, rs[0], base, client, stolen); st == http.StatusOK {
		t.Errorf("the thief's token refreshes after the reuse (grant not revoked): %v", out)
	}
}

// TestOAuthAuthorizeNoOpenRedirect: a self-registered client cannot make
// /oauth/authorize redirect to its redirect URI with a malformed request:
// the error is shown on okso's page (RFC 9700 §4.11.2).
func TestOAuthAuthorizeNoOpenRedirect(t *testing.T) {
	rs, _ := startAS(t, 1, &clock{t: time.Now()})
	resp, err := http.Post(rs[0].url+OAuthRegisterPath, "application/json", strings.NewReader(`{"redirect_uris":["https://evil.example/phish"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	br := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = br.Get(rs[0].url + OAuthAuthorizePath + "?" + url.Values{
		"client_id": {reg.ClientID}, "redirect_uri": {"https://evil.example/phish"}, "response_type": {"x"},
	}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Location") != "" {
		t.Errorf("malformed request: %d Location %q, want 400 and the page", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestOAuthTokenUnknownClientIsGeneric: the token endpoint tells an
// anonymous caller only that a client is unknown, never why (a fetch
// error names the address an internal name resolved to).
func TestOAuthTokenUnknownClientIsGeneric(t *testing.T) {
	rs, _ := startAS(t, 1, &clock{t: time.Now()})
	resp, err := http.PostForm(rs[0].url+OAuthTokenPath, url.Values{
		"grant_type": {"authorization_code"}, "client_id": {"https://localhost/internal-host"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || out["error"] != oauthInvalidClient || out["error_description"] != unknownClientDesc {
		t.Errorf("unknown metadata-document client: %d %v, want 401 invalid_client %q", resp.StatusCode, out, unknownClientDesc)
	}
}

// TestOAuthTokenCIMDFetchesLimited: the token endpoint fetches metadata
// documents under the replica's bound, not one per anonymous request. The
// clock stands still: the bound's burst, and nothing refilled.
func TestOAuthTokenCIMDFetchesLimited(t *testing.T) {
	var hits atomic.Int64
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "no", http.StatusNotFound)
	}))
	defer ts.Close()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect("r")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	st, err := bus.OpenOAuth(t.Context(), nc, bus.OAuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	still := time.Now()
	s, err := NewOAuthServer(OAuthServerOptions{Store: st, Signer: signer, Now: func() time.Time { return still },
		CIMD: CIMDOptions{AllowLoopback: true, TLS: ts.Client().Transport.(*http.Transport).TLSClientConfig}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	s.routes(mux, func(*http.Request) string { return "http://gw" })
	gw := httptest.NewServer(mux)
	defer gw.Close()
	const n = 2 * cimdBurst
	for i := range n {
		resp, err := http.PostForm(gw.URL+OAuthTokenPath, url.Values{
			"grant_type": {"refresh_token"}, "client_id": {ts.URL + "/victim/" + strconv.Itoa(i)},
		})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if h := hits.Load(); h != cimdBurst {
		t.Errorf("%d anonymous token requests made %d fetches, want the burst, %d", n, h, cimdBurst)
	}
}

// TestOAuthAuthorizeJunkSparesSignIns: malformed authorization requests
// do not spend the replica's budget of sign-ins.
func TestOAuthAuthorizeJunkSparesSignIns(t *testing.T) {
	rs, _ := startAS(t, 1, &clock{t: time.Now()})
	for range requestBurst + 5 {
		resp, err := http.Get(rs[0].url + OAuthAuthorizePath)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	const redirect = "http://127.0.0.1:9/cb"
	resp, err := http.Post(rs[0].url+OAuthRegisterPath, "application/json", strings.NewReader(`{"redirect_uris":["`+redirect+`"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	sum := sha256.Sum256([]byte(strings.Repeat("v", 43)))
	resp, err = http.Get(rs[0].url + OAuthAuthorizePath + "?" + url.Values{
		"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
		"resource": {rs[0].url + "/mcp"},
	}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("sign-in after %d junk requests: %s, want the page", requestBurst+5, resp.Status)
	}
}

// TestOAuthUnusedClientsFreeTheCap: registered clients never granted
// count against MaxClients only unusedClientTTL, so junk registrations
// cannot lock new clients out for ClientTTL; a client granted once
// lives on past that.
func TestOAuthUnusedClientsFreeTheCap(t *testing.T) {
	clk := &clock{t: time.Now()}
	rs, base := startAS(t, 1, clk)
	s := rs[0].s
	st, tok := signInAS(t, rs[0], rs[0], base, nil, nil)
	if st != http.StatusOK {
		t.Fatalf("sign in: %d %v", st, tok)
	}
	s.o.MaxClients = 10
	reg := func() int {
		resp, err := http.Post(rs[0].url+OAuthRegisterPath, "application/json", strings.NewReader(`{"redirect_uris":["http://127.0.0.1/cb"]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range s.o.MaxClients - 1 { // the junk: never used
		if c := reg(); c != http.StatusCreated {
			t.Fatalf("junk registration: %d", c)
		}
	}
	if c := reg(); c != http.StatusForbidden {
		t.Fatalf("registration over the cap: %d, want 403", c)
	}
	clk.add(unusedClientTTL)
	if c := reg(); c != http.StatusCreated {
		t.Errorf("registration once the junk is %v old: %d, want 201", unusedClientTTL, c)
	}
	if st, out := refreshAS(t, rs[0], base, tok["client_id"].(string), tok["refresh_token"].(string)); st != http.StatusOK {
		t.Errorf("the granted client's refresh after %v: %d %v", unusedClientTTL, st, out)
	}
}
