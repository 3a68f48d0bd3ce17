package auth_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// FuzzVerify feeds arbitrary strings to a verifier. It must never panic,
// every failure must wrap ErrInvalid, and only a token minted by the signer
// may verify: its signed part must be one the signer produced, and the
// claims must be the ones minted.
func FuzzVerify(f *testing.F) {
	s, err := auth.LoadOrCreateSigner(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	v := auth.NewVerifier(s.Public(), auth.AudienceGateway)

	// Tokens minted by the signer, by their signed part (header.claims).
	minted := map[string]string{} // signed part -> jti
	add := func(o auth.MintOptions) {
		tok, err := s.Mint(o)
		if err != nil {
			f.Fatal(err)
		}
		c, err := v.Verify(tok)
		if o.Audience == "" || o.Audience == auth.AudienceGateway {
			if err != nil {
				f.Fatalf("minted token does not verify: %v", err)
			}
			i := strings.LastIndexByte(tok, '.')
			minted[tok[:i]] = c.ID
		}
		f.Add(tok)
	}
	add(auth.MintOptions{Subject: "agent-1", Tenant: "acme", Scopes: []string{auth.ScopeReadOnly}})
	add(auth.MintOptions{Subject: "agent-2", Tenant: "other", Scopes: []string{auth.ScopeMutating, auth.ScopeDestructive}, TTL: 24 * time.Hour})
	add(auth.MintOptions{Subject: "01hzx9k3m4p7q8r9s0t1v2w3xy", Tenant: "acme", Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice})

	// Forgeries of the kinds TestVerifyRejects covers.
	_, other, _ := ed25519.GenerateKey(nil)
	now := time.Now()
	hs, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, validClaims(now)).SignedString([]byte(s.Public()))
	ed, _ := jwt.NewWithClaims(jwt.SigningMethodEdDSA, validClaims(now)).SignedString(other)
	f.Add(hs)
	f.Add(ed)
	f.Add(b64(map[string]string{"alg": "none", "typ": "JWT"}) + "." + b64(validClaims(now)) + ".")
	f.Add("")
	f.Add("a.b.c")
	f.Add(strings.Repeat("A", 9000))

	f.Fuzz(func(t *testing.T, tok string) {
		c, err := v.Verify(tok)
		if err != nil {
			if !errors.Is(err, auth.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if c != nil {
				t.Fatalf("claims returned with an error")
			}
			return
		}
		i := strings.LastIndexByte(tok, '.')
		if i < 0 {
			t.Fatalf("verified a token with no signature: %q", tok)
		}
		jti, ok := minted[tok[:i]]
		if !ok {
			t.Fatalf("verified a token the signer never minted: %q", tok)
		}
		if c.ID != jti {
			t.Fatalf("verified claims jti %s, minted %s", c.ID, jti)
		}
	})
}

// FuzzTenantRule: a token verifies exactly when its tenant is one the
// contract allows (schemas.ValidTenant, the rule the tier and gateway
// use); auth keeps its own copy so it imports no other okso package.
func FuzzTenantRule(f *testing.F) {
	s, err := auth.LoadOrCreateSigner(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	v := auth.NewVerifier(s.Public(), auth.AudienceGateway)
	for _, tenant := range []string{"demo", "A-Z_09", "a b", "a.b", "*", ">", strings.Repeat("x", 64), strings.Repeat("x", 65), "é", "a\n"} {
		f.Add(tenant)
	}
	f.Fuzz(func(t *testing.T, tenant string) {
		if tenant == "" {
			return // Mint refuses it before the rule applies
		}
		tok, err := s.Mint(auth.MintOptions{Subject: "agent-1", Tenant: tenant, Scopes: []string{auth.ScopeReadOnly}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Verify(tok)
		if got, want := err == nil, schemas.ValidTenant(tenant); got != want {
			t.Fatalf("tenant %q: verified %v, schemas.ValidTenant says %v (%v)", tenant, got, want, err)
		}
	})
}

// FuzzIssuerClaims feeds arbitrary claims, validly signed by a trusted
// issuer's key, to the mapping of external tokens. It must never panic,
// and a token it accepts must come out as the configuration says: the
// subject under the issuer's name, a tenant of the allow-list, only
// okso's call scopes, and an expiry.
func FuzzIssuerClaims(f *testing.F) {
	p := newIDP(f)
	p.addKey(f, "k", "EdDSA", true)
	is, err := auth.NewIssuers(f.Context(), []auth.IssuerConfig{p.config("kc")}, auth.IssuersOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(is.Close)
	tr := auth.NewTrust(auth.NewVerifier(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)), auth.AudienceGateway), is)
	now := time.Now()
	for _, c := range []jwt.MapClaims{
		p.claims(now),
		{"iss": p.srv.URL, "sub": "a", "aud": []string{"x", testAudience}, "exp": now.Add(time.Hour).Unix(), "org": "globex", "scp": []string{"okso.write"}},
		{"iss": p.srv.URL, "sub": "a", "aud": testAudience, "exp": "soon", "org": "acme"},
		{"iss": p.srv.URL, "sub": 7, "aud": testAudience, "exp": now.Add(time.Hour).Unix(), "org": []string{"acme"}},
	} {
		b, _ := json.Marshal(c)
		f.Add(string(b))
	}
	key := p.keys["k"].(ed25519.PrivateKey)
	header := b64(map[string]string{"alg": "EdDSA", "kid": "k", "typ": "JWT"})
	f.Fuzz(func(t *testing.T, claims string) {
		signed := header + "." + base64.RawURLEncoding.EncodeToString([]byte(claims))
		tok := signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(signed)))
		c, err := tr.Verify(tok)
		if err != nil {
			if !errors.Is(err, auth.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !strings.HasPrefix(c.Subject, "kc:") || len(c.Subject) == len("kc:") {
			t.Fatalf("subject %q", c.Subject)
		}
		if c.Tenant != "acme" && c.Tenant != "globex" {
			t.Fatalf("tenant %q outside the allow-list", c.Tenant)
		}
		for _, s := range c.Scopes() {
			if s != auth.ScopeReadOnly && s != auth.ScopeMutating {
				t.Fatalf("scope %q is not one the configuration maps to", s)
			}
		}
		if c.ExpiresAt == nil {
			t.Fatal("accepted without exp")
		}
	})
}
