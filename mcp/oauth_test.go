package mcp

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// Exact redirect URIs, but for the port of an http redirect on a
// loopback IP literal (RFC 8252 §7.3).
func TestRedirectMatches(t *testing.T) {
	reg := []string{"https://claude.ai/api/mcp/auth_callback", "http://127.0.0.1/cb", "http://[::1]:80/cb", "http://localhost:3000/cb"}
	for _, tc := range []struct {
		uri  string
		want bool
	}{
		{"https://claude.ai/api/mcp/auth_callback", true},
		{"https://claude.ai/api/mcp/auth_callback/", false},
		{"https://claude.ai/api/mcp/auth_callback?x=1", false},
		{"https://claude.ai:8443/api/mcp/auth_callback", false},
		{"https://evil.example/api/mcp/auth_callback", false},
		{"http://127.0.0.1:51234/cb", true},
		{"http://127.0.0.1/cb", true},
		{"http://127.0.0.1:51234/cb2", false},
		{"http://127.0.0.1:51234/cb?x", false},
		{"http://[::1]:9999/cb", true},
		{"http://localhost:3000/cb", true},
		{"http://localhost:3001/cb", false}, // localhost is a name: exact only
		{"https://127.0.0.1:51234/cb", false},
		{"http://user@127.0.0.1:51234/cb", false},
	} {
		if got := redirectMatches(reg, tc.uri); got != tc.want {
			t.Errorf("redirectMatches(%q) = %v, want %v", tc.uri, got, tc.want)
		}
	}
}

func TestCheckRedirectURI(t *testing.T) {
	for _, tc := range []struct {
		uri string
		ok  bool
	}{
		{"https://claude.ai/api/mcp/auth_callback", true},
		{"http://127.0.0.1:1/cb", true},
		{"http://localhost/cb", true},
		{"com.example.app:/cb", true},
		{"http://example.com/cb", false},
		{"javascript:alert(1)", false},
		{"data:text/html,x", false},
		{"https://claude.ai/cb#frag", false},
		{"/relative", false},
		{"https://user:pw@claude.ai/cb", false},
	} {
		if err := checkRedirectURI(tc.uri); (err == nil) != tc.ok {
			t.Errorf("checkRedirectURI(%q) = %v, want ok %v", tc.uri, err, tc.ok)
		}
	}
}

// Where a client metadata document may be fetched from: public
// addresses, and 127.0.0.1 alone with the test-only allowance.
func TestPublicAddr(t *testing.T) {
	for _, tc := range []struct {
		addr          string
		want, allowed bool // without, with the allowance
	}{
		{"93.184.216.34", true, true},
		{"2606:2800:220:1::1", true, true},
		{"127.0.0.1", false, true},
		{"127.0.0.2", false, false},
		{"::1", false, false},
		{"10.1.2.3", false, false},
		{"172.16.0.1", false, false},
		{"192.168.1.1", false, false},
		{"169.254.169.254", false, false}, // cloud metadata
		{"100.64.0.1", false, false},
		{"0.0.0.0", false, false},
		{"fe80::1", false, false},
		{"fd00::1", false, false},
		{"224.0.0.1", false, false},
		// IPv4 inside IPv6: judged by the IPv4 address, or refused.
		{"::ffff:10.0.0.5", false, false},
		{"64:ff9b::a9fe:a9fe", false, false}, // NAT64 of 169.254.169.254
		{"64:ff9b::a00:5", false, false},
		{"64:ff9b::5db8:d822", true, true}, // NAT64 of 93.184.216.34
		{"64:ff9b:1::a00:5", false, false},
		{"2002:a9fe:a9fe::1", false, false}, // 6to4
		{"2002:5db8:d822::1", true, true},
		{"::a00:5", false, false},             // IPv4-compatible
		{"2001:0:a9fe:a9fe::1", false, false}, // Teredo
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := publicAddr(a, false); got != tc.want {
			t.Errorf("publicAddr(%s) = %v, want %v", a, got, tc.want)
		}
		if got := publicAddr(a, true); got != tc.allowed {
			t.Errorf("publicAddr(%s, loopback allowed) = %v, want %v", a, got, tc.allowed)
		}
	}
}

func TestCheckCIMDURL(t *testing.T) {
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"https://claude.ai/oauth/mcp-oauth-client-metadata", true},
		{"http://claude.ai/client.json", false},
		{"https://claude.ai", false},
		{"https://claude.ai/", false},
		{"https://claude.ai/a/../b", false},
		{"https://claude.ai/a#f", false},
		{"https://u:p@claude.ai/a", false},
	} {
		if err := checkCIMDURL(tc.id); (err == nil) != tc.ok {
			t.Errorf("checkCIMDURL(%q) = %v, want ok %v", tc.id, err, tc.ok)
		}
	}
}

func TestSubjectGrant(t *testing.T) {
	for _, tc := range []struct {
		sub, client, grant string
		ok                 bool
	}{
		{"oauth:cabc:gxyz", "cabc", "gxyz", true},
		{"oauth:https://claude.ai/client.json:gxyz", "https://claude.ai/client.json", "gxyz", true},
		{"oauth::g", "", "", false},
		{"oauth:c:", "", "", false},
		{"agent-1", "", "", false},
	} {
		c, g, ok := subjectGrant(tc.sub)
		if c != tc.client || g != tc.grant || ok != tc.ok {
			t.Errorf("subjectGrant(%q) = %q, %q, %v", tc.sub, c, g, ok)
		}
	}
	if c, g, ok := subjectGrant(oauthSubject("https://x.example/c", "g1")); !ok || c != "https://x.example/c" || g != "g1" {
		t.Errorf("round trip: %q %q %v", c, g, ok)
	}
}

func TestUserCodes(t *testing.T) {
	for range 100 {
		c := newUserCode()
		if n, ok := NormalizeUserCode(ShowUserCode(c)); !ok || n != c {
			t.Fatalf("code %s shown %s reads back as %q, %v", c, ShowUserCode(c), n, ok)
		}
	}
	for _, s := range []string{"", "BCDF-234", "BCDF-23456", "AEIO-2345", "bcdf 2345x", "BCD.-2345"} {
		if _, ok := NormalizeUserCode(s); ok {
			t.Errorf("%q read as a user code", s)
		}
	}
	if n, ok := NormalizeUserCode("bcdf-2345"); !ok || n != "BCDF2345" {
		t.Errorf("lower case: %q, %v", n, ok)
	}
}

// Issued reads the header of anything sent as a bearer token.
func FuzzIssued(f *testing.F) {
	f.Add("eyJhbGciOiJFZERTQSIsImtpZCI6IngifQ.e30.sig")
	f.Add("..")
	f.Add("not a token")
	s := &OAuthServer{}
	f.Fuzz(func(t *testing.T, token string) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Issued(%q) panicked: %v", token, r)
			}
		}()
		_ = s.issuedKid(token, "x")
	})
}

// FuzzHeaderNamesKid: a token header's kid is read as json.Unmarshal
// reads it, whatever the header.
func FuzzHeaderNamesKid(f *testing.F) {
	for _, s := range []string{
		`{"alg":"EdDSA","kid":"x","typ":"JWT"}`, `{"alg":"EdDSA","typ":"JWT"}`, `{"kid":"y"}`, `{"KID":"x"}`,
		`{"kid":"y","Kid":"x"}`, `{"kid":"x","kid":"y"}`, `{"kid":"y","kid":"x"}`, `{"kid":null}`, `{"kid":"x","kid":null}`,
		`{"kid":"\u0078"}`, `{"k\u0069d":"x"}`, `{"kid":1}`, `{"a":{"b":1,"b":2},"kid":"x"}`, `{"a":01,"kid":"x"}`,
		`{"a":"\xff","kid":"x"}`, `{"a":1e400,"kid":"x"}`, `{}`, `null`, `[]`, `"x"`, `{"kid":"x"} x`, ` {"kid" : "x"} `,
		"{\"\u212aid\":\"x\"}", "{\"a\":\"\xff\",\"kid\":\"x\"}", `{"kid":"x"`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h struct {
			Kid string `json:"kid"`
		}
		err := json.Unmarshal(b, &h)
		for _, kid := range []string{"x", "", h.Kid} {
			if got, want := headerNamesKid(b, kid), err == nil && h.Kid == kid; got != want {
				t.Fatalf("%q names %q: %v; json.Unmarshal %q, %v", b, kid, got, h.Kid, err)
			}
		}
	})
}

// What a client says of itself (registration, metadata document) is
// checked without a panic, and what is kept passes the redirect checks.
func FuzzCheckClientMetadata(f *testing.F) {
	f.Add(`{"redirect_uris":["https://claude.ai/api/mcp/auth_callback"],"client_name":"Claude"}`)
	f.Add(`{"redirect_uris":["http://127.0.0.1:1/cb"],"token_endpoint_auth_method":"none","grant_types":["authorization_code"]}`)
	f.Add(`{"redirect_uris":["javascript:alert(1)"]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		var m oauthex.ClientRegistrationMetadata
		if json.Unmarshal([]byte(doc), &m) != nil {
			return
		}
		c, _, err := checkClientMetadata(&m)
		if err != nil {
			return
		}
		for _, u := range c.RedirectURIs {
			if checkRedirectURI(u) != nil || !redirectMatches(c.RedirectURIs, u) {
				t.Fatalf("kept redirect URI %q fails the checks", u)
			}
		}
	})
}

// The protected-resource metadata lists the operator's identity
// providers first (clients take the first), then the gateway itself.
func TestAuthorizationServers(t *testing.T) {
	for _, tc := range []struct {
		issuers []string
		own     bool
		want    string
	}{
		{nil, false, "[]"},
		{nil, true, "[http://gw]"},
		{[]string{"https://idp"}, false, "[https://idp]"},
		{[]string{"https://idp"}, true, "[https://idp http://gw]"},
	} {
		gt := &gate{servers: tc.issuers}
		if tc.own {
			gt.oauth = &OAuthServer{}
		}
		got := gt.authorizationServers("http://gw")
		if got == nil || fmt.Sprint(got) != tc.want {
			t.Errorf("issuers %v, own %v: %v, want %s (never null)", tc.issuers, tc.own, got, tc.want)
		}
	}
}
