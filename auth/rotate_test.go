package auth_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/okso-io/okso/auth"
)

// TestRotate: after a rotation, a verifier that loads the kept keys accepts
// tokens of the old and of the new key; one that does not, only the new.
func TestRotate(t *testing.T) {
	dir := t.TempDir()
	old, err := auth.LoadOrCreateSigner(dir)
	if err != nil {
		t.Fatal(err)
	}
	mint := func(s *auth.Signer) string {
		tok, err := s.Mint(auth.MintOptions{Subject: "a", Tenant: "t", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	oldTok := mint(old)
	cur, err := auth.Rotate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cur.KeyID() == old.KeyID() {
		t.Fatal("rotation kept the key")
	}
	newTok := mint(cur)
	loaded, err := auth.LoadOrCreateSigner(dir)
	if err != nil || loaded.KeyID() != cur.KeyID() {
		t.Fatalf("data dir holds %v (%v), want the new key", loaded, err)
	}
	extra, err := auth.LoadExtraKeys(dir)
	if err != nil || len(extra) != 1 {
		t.Fatalf("kept keys %d (%v), want 1", len(extra), err)
	}
	both := auth.NewKeySetVerifier(cur.Public(), extra, auth.AudienceGateway)
	for _, tok := range []string{oldTok, newTok} {
		if _, err := both.Verify(tok); err != nil {
			t.Errorf("key-set verifier refused a token: %v", err)
		}
	}
	onlyNew := auth.NewVerifier(cur.Public(), auth.AudienceGateway)
	if _, err := onlyNew.Verify(oldTok); !errors.Is(err, auth.ErrInvalid) {
		t.Errorf("a verifier without the old key accepted its token: %v", err)
	}
}

// TestVerifyCacheHonoursExpiry: a token verified once is served from the
// cache, and still refused once it expires.
func TestVerifyCacheHonoursExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := auth.LoadOrCreateSigner(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		tok, err := s.Mint(auth.MintOptions{Subject: "a", Tenant: "t", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		v := auth.NewVerifier(s.Public(), auth.AudienceGateway)
		for range 2 {
			c, err := v.Verify(tok)
			if err != nil || c.Subject != "a" {
				t.Fatalf("fresh token: %+v %v", c, err)
			}
			c.Subject = "mutated" // a caller's copy must not change the cache
		}
		<-time.After(2 * time.Minute)
		if _, err := v.Verify(tok); !errors.Is(err, auth.ErrInvalid) {
			t.Fatalf("expired cached token: %v, want ErrInvalid", err)
		}
	})
}
