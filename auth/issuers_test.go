package auth_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"

	"github.com/okso-io/okso/auth"
)

// idp is an OpenID provider's discovery and key set, served on loopback
// HTTP with keys made by the test; it signs tokens as the provider would.
// Which keys it publishes can change while it runs (a rotation).
type idp struct {
	srv     *httptest.Server
	mu      sync.Mutex
	keys    map[string]crypto.Signer // by kid
	publish []string                 // kids in the key set
	fetches atomic.Int32             // of the key set
}

func newIDP(t testing.TB) *idp {
	t.Helper()
	p := &idp{keys: map[string]crypto.Signer{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"issuer": p.srv.URL, "jwks_uri": p.srv.URL + "/jwks"})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		p.fetches.Add(1)
		p.mu.Lock()
		defer p.mu.Unlock()
		var set jwkset.JWKSMarshal
		for _, kid := range p.publish {
			k, err := jwkset.NewJWKFromKey(p.keys[kid].Public(), jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid, USE: jwkset.UseSig}})
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			set.Keys = append(set.Keys, k.Marshal())
		}
		_ = json.NewEncoder(w).Encode(set)
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// addKey makes a key of alg's kind under kid, published or not.
func (p *idp) addKey(t testing.TB, kid, alg string, publish bool) {
	t.Helper()
	var k crypto.Signer
	var err error
	switch alg {
	case "RS256":
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	case "ES256":
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "EdDSA":
		_, k, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[kid] = k
	if publish {
		p.publish = append(p.publish, kid)
	}
}

func (p *idp) publishKey(kid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.publish = append(p.publish, kid)
}

// sign signs claims with the key kid, by the algorithm of its kind.
func (p *idp) sign(t *testing.T, kid string, c jwt.MapClaims) string {
	t.Helper()
	p.mu.Lock()
	k := p.keys[kid]
	p.mu.Unlock()
	var m jwt.SigningMethod
	switch k.(type) {
	case *rsa.PrivateKey:
		m = jwt.SigningMethodRS256
	case *ecdsa.PrivateKey:
		m = jwt.SigningMethodES256
	default:
		m = jwt.SigningMethodEdDSA
	}
	tok := jwt.NewWithClaims(m, c)
	tok.Header["kid"] = kid
	s, err := tok.SignedString(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const testAudience = "api://okso-test"

func (p *idp) claims(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss":   p.srv.URL,
		"sub":   "alice",
		"aud":   testAudience,
		"exp":   now.Add(time.Hour).Unix(),
		"iat":   now.Unix(),
		"jti":   "idp-jti-1",
		"org":   "acme",
		"scope": "openid okso.read",
	}
}

func (p *idp) config(name string) auth.IssuerConfig {
	return auth.IssuerConfig{
		Name: name, Issuer: p.srv.URL, Audience: testAudience,
		TenantClaim: "org", Tenants: []string{"acme", "globex"},
		Scopes: map[string]string{"okso.read": auth.ScopeReadOnly, "okso.write": auth.ScopeMutating},
	}
}

// newTrust trusts okso's own key and the given issuers.
func newTrust(t *testing.T, ctx context.Context, o auth.IssuersOptions, cfgs ...auth.IssuerConfig) (*auth.Trust, *auth.Signer, *auth.Issuers) {
	t.Helper()
	is, err := auth.NewIssuers(ctx, cfgs, o)
	if err != nil {
		t.Fatalf("NewIssuers: %v", err)
	}
	t.Cleanup(is.Close)
	s := newSigner(t)
	return auth.NewTrust(auth.NewVerifier(s.Public(), auth.AudienceGateway), is), s, is
}

func TestIssuersAccept(t *testing.T) {
	p := newIDP(t)
	for _, alg := range []string{"RS256", "ES256", "EdDSA"} {
		p.addKey(t, "k-"+alg, alg, true)
	}
	fixed := newIDP(t)
	fixed.addKey(t, "k1", "ES256", true)
	fc := fixed.config("corp")
	fc.TenantClaim, fc.Tenants, fc.Scopes, fc.ScopeClaim = "", nil, nil, "scp"
	fc.Tenant = "globex"
	tr, s, is := newTrust(t, t.Context(), auth.IssuersOptions{}, p.config("kc"), fc)
	now := time.Now()
	for _, alg := range []string{"RS256", "ES256", "EdDSA"} {
		t.Run(alg, func(t *testing.T) {
			c, err := tr.Verify(p.sign(t, "k-"+alg, p.claims(now)))
			if err != nil {
				t.Fatal(err)
			}
			if c.Subject != "kc:alice" || c.Tenant != "acme" || c.Scope != auth.ScopeReadOnly || c.ID != "idp-jti-1" {
				t.Errorf("claims: sub %q tenant %q scope %q jti %q; want kc:alice, acme, %s, idp-jti-1", c.Subject, c.Tenant, c.Scope, auth.ScopeReadOnly, c.ID)
			}
		})
	}
	t.Run("fixed tenant and scp list", func(t *testing.T) {
		c := fixed.claims(now)
		delete(c, "scope")
		c["scp"] = []string{auth.ScopeMutating, "profile"}
		c["org"] = "initech" // not read: the tenant is fixed
		got, err := tr.Verify(fixed.sign(t, "k1", c))
		if err != nil {
			t.Fatal(err)
		}
		if got.Subject != "corp:alice" || got.Tenant != "globex" || got.Scope != auth.ScopeMutating {
			t.Errorf("claims: sub %q tenant %q scope %q; want corp:alice, globex, %s", got.Subject, got.Tenant, got.Scope, auth.ScopeMutating)
		}
	})
	t.Run("okso tokens still", func(t *testing.T) {
		c, err := tr.Verify(mint(t, s, auth.MintOptions{Subject: "a1", Tenant: "acme", Scopes: []string{auth.ScopeReadOnly}}))
		if err != nil || c.Subject != "a1" {
			t.Fatalf("okso token: %v, %+v", err, c)
		}
	})
	t.Run("cached", func(t *testing.T) {
		tok := p.sign(t, "k-ES256", p.claims(now))
		if _, ok := tr.Cached(tok); ok {
			t.Fatal("cached before it was verified")
		}
		if _, err := tr.Verify(tok); err != nil {
			t.Fatal(err)
		}
		if jti, ok := tr.Cached(tok); !ok || jti != "idp-jti-1" {
			t.Errorf("Cached = %q, %v; want idp-jti-1, true", jti, ok)
		}
	})
	if got := strings.Join(is.URLs(), " "); got != p.srv.URL+" "+fixed.srv.URL {
		t.Errorf("issuer URLs %q", got)
	}
}

func TestIssuersRefuse(t *testing.T) {
	p := newIDP(t)
	p.addKey(t, "k1", "RS256", true)
	p.addKey(t, "hidden", "RS256", false)
	other := newIDP(t) // an issuer okso does not trust
	other.addKey(t, "k1", "RS256", true)
	tr, _, _ := newTrust(t, t.Context(), auth.IssuersOptions{}, p.config("kc"))
	now := time.Now()
	with := func(f func(jwt.MapClaims)) string {
		c := p.claims(now)
		f(c)
		return p.sign(t, "k1", c)
	}
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, p.claims(now))
	hs.Header["kid"] = "k1"
	hmac, err := hs.SignedString([]byte("the issuer's public key, which anyone has"))
	if err != nil {
		t.Fatal(err)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, p.claims(now)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token, want string
	}{
		{"none", none, "signing algorithm"},
		{"HMAC", hmac, "signing algorithm"},
		{"another issuer", other.sign(t, "k1", other.claims(now)), "neither okso nor one of the trusted issuers"},
		{"another issuer's key, this iss", func() string {
			c := p.claims(now)
			return other.sign(t, "k1", c)
		}(), "signature does not verify"},
		{"another audience", with(func(c jwt.MapClaims) { c["aud"] = "api://someone-else" }), "not meant for this server"},
		{"expired", with(func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Minute).Unix() }), "expired at"},
		{"no exp", with(func(c jwt.MapClaims) { delete(c, "exp") }), "no expiry"},
		{"not yet", with(func(c jwt.MapClaims) { c["nbf"] = now.Add(time.Minute).Unix() }), "not valid yet"},
		{"tenant outside the allow-list", with(func(c jwt.MapClaims) { c["org"] = "initech" }), "outside the tenants issuer kc is trusted for"},
		{"no tenant", with(func(c jwt.MapClaims) { delete(c, "org") }), "no tenant claim org"},
		{"no sub", with(func(c jwt.MapClaims) { delete(c, "sub") }), "subject"},
		{"unpublished key", p.sign(t, "hidden", p.claims(now)), "does not publish"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tr.Verify(tc.token)
			if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify: %v; want ErrInvalid saying %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "initech") {
				t.Errorf("the refusal quotes the token's own text: %v", err)
			}
		})
	}
}

// TestIssuersRotation: a token signed with a key the issuer published
// after okso fetched its key set is accepted once the set is fetched
// again, and tokens with unknown key ids make okso fetch it at most once
// a minute (in the fake time of a synctest bubble).
func TestIssuersRotation(t *testing.T) {
	p := newIDP(t) // outside the bubble: its goroutines block on the network
	p.addKey(t, "old", "ES256", true)
	p.addKey(t, "new", "EdDSA", false)
	p.addKey(t, "later", "RS256", false)
	synctest.Test(t, func(t *testing.T) {
		// No kept connections: their readers would block on the network
		// inside the bubble, and fake time would never move on.
		tr, _, _ := newTrust(t, t.Context(), auth.IssuersOptions{Transport: &http.Transport{DisableKeepAlives: true}}, p.config("kc"))
		if n := p.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches at start; want 1", n)
		}
		now := time.Now()
		if _, err := tr.Verify(p.sign(t, "old", p.claims(now))); err != nil {
			t.Fatal(err)
		}
		p.publishKey("new")
		if _, err := tr.Verify(p.sign(t, "new", p.claims(now))); err != nil {
			t.Fatalf("a token of the rotated key: %v", err)
		}
		if n := p.fetches.Load(); n != 2 {
			t.Fatalf("%d fetches after the rotation; want 2", n)
		}
		// Within the minute, made-up key ids fetch nothing, nor does
		// a key published meanwhile.
		p.publishKey("later")
		for range 5 {
			c := p.claims(now)
			tok := p.sign(t, "later", c)
			if _, err := tr.Verify(tok); err == nil || !strings.Contains(err.Error(), "does not publish") {
				t.Fatalf("a key published within the minute: %v; want refused", err)
			}
		}
		if n := p.fetches.Load(); n != 2 {
			t.Fatalf("%d fetches after unknown kids within the minute; want 2", n)
		}
		time.Sleep(refetchEvery)
		now = time.Now()
		if _, err := tr.Verify(p.sign(t, "later", p.claims(now))); err != nil {
			t.Fatalf("a minute later: %v", err)
		}
		if n := p.fetches.Load(); n != 3 {
			t.Fatalf("%d fetches a minute later; want 3", n)
		}
	})
}

const refetchEvery = time.Minute

func TestIssuersStart(t *testing.T) {
	p := newIDP(t)
	p.addKey(t, "k1", "RS256", true)
	for _, tc := range []struct {
		name string
		cfg  func() auth.IssuerConfig
		want string
	}{
		{"unreachable", func() auth.IssuerConfig {
			c := p.config("kc")
			c.Issuer = "http://127.0.0.1:1"
			return c
		}, "discovery"},
		{"not https", func() auth.IssuerConfig {
			c := p.config("kc")
			c.Issuer = "http://idp.example.com"
			return c
		}, "not https"},
		{"another name", func() auth.IssuerConfig {
			c := p.config("kc")
			c.Issuer = p.srv.URL + "/"
			return c
		}, "configure the issuer exactly as it names itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is, err := auth.NewIssuers(t.Context(), []auth.IssuerConfig{tc.cfg()}, auth.IssuersOptions{Timeout: 5 * time.Second})
			is.Close()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "issuer kc") {
				t.Fatalf("NewIssuers: %v; want an error about issuer kc saying %q", err, tc.want)
			}
		})
	}
}
