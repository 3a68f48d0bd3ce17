package mcp

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
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
