package auth_test

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/auth"
)

func newSigner(t testing.TB) *auth.Signer {
	t.Helper()
	s, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatalf("LoadOrCreateSigner: %v", err)
	}
	return s
}

func mint(t testing.TB, s *auth.Signer, o auth.MintOptions) string {
	t.Helper()
	tok, err := s.Mint(o)
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	return tok
}

// validClaims are claims that the test key's verifier accepts; each case
// of TestVerifyRejects changes one thing.
func validClaims(now time.Time) jwt.MapClaims {
	return jwt.MapClaims{
		"iss":    auth.Issuer,
		"sub":    "agent-1",
		"aud":    []string{auth.AudienceGateway},
		"exp":    now.Add(time.Hour).Unix(),
		"iat":    now.Unix(),
		"nbf":    now.Add(-time.Second).Unix(),
		"jti":    "01hzxc0000000000000000jt10",
		"tenant": "acme",
		"scope":  auth.ScopeReadOnly,
	}
}

func signWith(t testing.TB, method jwt.SigningMethod, key any, c jwt.Claims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatalf("sign %s: %v", method.Alg(), err)
	}
	return tok
}

func b64(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// claimsWith is validClaims with claim k set to val, or removed (nil).
func claimsWith(now time.Time, k string, val any) jwt.MapClaims {
	c := validClaims(now)
	if val == nil {
		delete(c, k)
	} else {
		c[k] = val
	}
	return c
}

func TestVerifyRejects(t *testing.T) {
	now := time.Now()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(pub, auth.AudienceGateway)

	with := func(k string, val any) jwt.MapClaims { return claimsWith(now, k, val) }
	ed := func(c jwt.MapClaims) string { return signWith(t, jwt.SigningMethodEdDSA, priv, c) }

	// Positive controls: the same construction, unchanged, verifies.
	for name, tok := range map[string]string{
		"valid":                ed(validClaims(now)),
		"nbf within leeway":    ed(with("nbf", now.Add(2*time.Second).Unix())),
		"aud as a string":      ed(with("aud", auth.AudienceGateway)),
		"aud among others":     ed(with("aud", []string{"other", auth.AudienceGateway})),
		"no scope":             ed(with("scope", nil)),
		"tenant max length":    ed(with("tenant", strings.Repeat("a", 64))),
		"tenant - and _":       ed(with("tenant", "a-b_C9")),
		"just under size cap":  ed(with("scope", strings.Repeat("x", 5800))),
		"exp just in the past": ed(with("exp", now.Add(-2*time.Second).Unix())),
		"tool_names seed":      ed(with("tool_names", "seed")),
		"tool_names safe":      ed(with("tool_names", "safe")),
		"node_tools false":     ed(with("node_tools", false)),
		"node_tools true":      ed(with("node_tools", true)),
	} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("control %s: %v", name, err)
		}
	}

	claimsSeg := b64(validClaims(now))
	edTok := ed(validClaims(now))
	edParts := strings.Split(edTok, ".")

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	oversize := ed(with("scope", strings.Repeat("x", 7000)))
	if len(oversize) <= 8192 {
		t.Fatalf("oversize token is only %d bytes", len(oversize))
	}

	cases := map[string]string{
		"alg none":           b64(map[string]string{"alg": "none", "typ": "JWT"}) + "." + claimsSeg + ".",
		"alg None":           b64(map[string]string{"alg": "None", "typ": "JWT"}) + "." + claimsSeg + ".",
		"alg none with sig":  b64(map[string]string{"alg": "none", "typ": "JWT"}) + "." + claimsSeg + "." + edParts[2],
		"alg none, no sig":   b64(map[string]string{"alg": "none", "typ": "JWT"}) + "." + claimsSeg,
		"no alg":             b64(map[string]string{"typ": "JWT"}) + "." + claimsSeg + "." + edParts[2],
		"HS256 raw pub key":  signWith(t, jwt.SigningMethodHS256, []byte(pub), validClaims(now)),
		"HS256 PEM pub key":  signWith(t, jwt.SigningMethodHS256, pubPEM, validClaims(now)),
		"HS512 raw pub key":  signWith(t, jwt.SigningMethodHS512, []byte(pub), validClaims(now)),
		"RS256 other key":    signWith(t, jwt.SigningMethodRS256, rsaKey, validClaims(now)),
		"ES256 other key":    signWith(t, jwt.SigningMethodES256, ecKey, validClaims(now)),
		"EdDSA other key":    signWith(t, jwt.SigningMethodEdDSA, otherPriv, validClaims(now)),
		"expired":            ed(with("exp", now.Add(-time.Minute).Unix())),
		"no exp":             ed(with("exp", nil)),
		"not yet valid":      ed(with("nbf", now.Add(time.Minute).Unix())),
		"issued in future":   ed(with("iat", now.Add(time.Minute).Unix())),
		"wrong audience":     ed(with("aud", []string{auth.AudienceDevice})),
		"no audience":        ed(with("aud", nil)),
		"empty audience":     ed(with("aud", []string{})),
		"missing tenant":     ed(with("tenant", nil)),
		"empty tenant":       ed(with("tenant", "")),
		"tenant with dot":    ed(with("tenant", "acme.other")),
		"tenant wildcard":    ed(with("tenant", "*")),
		"tenant gt":          ed(with("tenant", ">")),
		"tenant space":       ed(with("tenant", "ac me")),
		"tenant too long":    ed(with("tenant", strings.Repeat("a", 65))),
		"tenant non-ascii":   ed(with("tenant", "acmé")),
		"tenant number":      ed(with("tenant", 42)),
		"missing sub":        ed(with("sub", nil)),
		"empty sub":          ed(with("sub", "")),
		"missing jti":        ed(with("jti", nil)),
		"empty jti":          ed(with("jti", "")),
		"tool_names unknown": ed(with("tool_names", "dotted")),
		"tool_names number":  ed(with("tool_names", 1)),
		"node_tools string":  ed(with("node_tools", "false")),
		"node_tools number":  ed(with("node_tools", 0)),
		"node_tools object":  ed(with("node_tools", map[string]bool{"x": false})),
		"tampered tenant":    edParts[0] + "." + b64(with("tenant", "other")) + "." + edParts[2],
		"tampered signature": edParts[0] + "." + edParts[1] + "." + flip(edParts[2]),
		"signature dropped":  edParts[0] + "." + edParts[1] + ".",
		"four segments":      edTok + "." + edParts[2],
		"oversize":           oversize,
		"empty":              "",
		"garbage":            "not a token",
		"dots":               "..",
		"bad base64":         "!!!.???.***",
		"bearer prefix":      "Bearer " + edTok,
		"header not json":    base64.RawURLEncoding.EncodeToString([]byte("{")) + "." + claimsSeg + "." + edParts[2],
		"claims array":       edParts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte("[]")) + "." + edParts[2],
	}
	for name, tok := range cases {
		t.Run(name, func(t *testing.T) {
			c, err := v.Verify(tok)
			if err == nil {
				t.Fatalf("accepted; claims %+v", c)
			}
			if !errors.Is(err, auth.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if c != nil {
				t.Fatalf("claims returned with an error: %+v", c)
			}
		})
	}
}

// flip changes the first character of a base64url segment.
func flip(seg string) string {
	if seg[0] == 'A' {
		return "B" + seg[1:]
	}
	return "A" + seg[1:]
}

func TestRoundTrip(t *testing.T) {
	s := newSigner(t)
	gw := auth.NewVerifier(s.Public(), auth.AudienceGateway)
	dev := auth.NewVerifier(s.Public(), auth.AudienceDevice)

	t.Run("agent", func(t *testing.T) {
		before := time.Now().Truncate(time.Second)
		tok := mint(t, s, auth.MintOptions{
			Subject: "agent-1",
			Tenant:  "acme",
			Scopes:  []string{auth.ScopeReadOnly, auth.ScopeMutating},
		})
		c, err := gw.Verify(tok)
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if c.Subject != "agent-1" || c.Tenant != "acme" || c.Issuer != auth.Issuer {
			t.Errorf("claims %+v", c)
		}
		if !slices.Equal(c.Audience, jwt.ClaimStrings{auth.AudienceGateway}) {
			t.Errorf("audience %v", c.Audience)
		}
		if got := c.Scopes(); !slices.Equal(got, []string{auth.ScopeReadOnly, auth.ScopeMutating}) {
			t.Errorf("scopes %v", got)
		}
		if !c.HasScope(auth.ScopeReadOnly) || !c.HasScope(auth.ScopeMutating) ||
			c.HasScope(auth.ScopeDestructive) || c.HasScope(auth.ScopeDeviceConnect) || c.HasScope("") {
			t.Errorf("HasScope wrong for %q", c.Scope)
		}
		if _, err := ulid.ParseStrict(c.ID); err != nil || c.ID != strings.ToLower(c.ID) {
			t.Errorf("jti %q is not a lower-case ULID: %v", c.ID, err)
		}
		if c.ExpiresAt == nil || c.ExpiresAt.Sub(before) < time.Hour || c.ExpiresAt.Sub(before) > time.Hour+time.Minute {
			t.Errorf("exp %v, want about an hour after %v", c.ExpiresAt, before)
		}
		if kid := header(t, tok)["kid"]; kid != s.KeyID() {
			t.Errorf("kid %v, want %s", kid, s.KeyID())
		}
		if alg := header(t, tok)["alg"]; alg != "EdDSA" {
			t.Errorf("alg %v, want EdDSA", alg)
		}
		// Audiences are separate: an agent token does not open the device door.
		if _, err := dev.Verify(tok); !errors.Is(err, auth.ErrInvalid) {
			t.Errorf("agent token accepted by the device verifier: %v", err)
		}
	})

	t.Run("device", func(t *testing.T) {
		node := strings.ToLower(ulid.Make().String())
		tok := mint(t, s, auth.MintOptions{
			Subject:  node,
			Tenant:   "acme",
			Scopes:   []string{auth.ScopeDeviceConnect},
			Audience: auth.AudienceDevice,
			TTL:      10 * time.Minute,
		})
		c, err := dev.Verify(tok)
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if c.Subject != node || c.Tenant != "acme" || !c.HasScope(auth.ScopeDeviceConnect) || c.HasScope(auth.ScopeReadOnly) {
			t.Errorf("claims %+v", c)
		}
		if got := c.ExpiresAt.Sub(c.IssuedAt.Time); got != 10*time.Minute {
			t.Errorf("ttl %v, want 10m", got)
		}
		if _, err := gw.Verify(tok); !errors.Is(err, auth.ErrInvalid) {
			t.Errorf("device token accepted by the gateway verifier: %v", err)
		}
	})

	t.Run("jti unique", func(t *testing.T) {
		seen := map[string]bool{}
		for range 100 {
			c, err := gw.Verify(mint(t, s, auth.MintOptions{Subject: "a", Tenant: "t"}))
			if err != nil {
				t.Fatal(err)
			}
			if seen[c.ID] {
				t.Fatalf("jti %s minted twice", c.ID)
			}
			seen[c.ID] = true
		}
	})

	t.Run("minted in the past", func(t *testing.T) {
		tok := mint(t, s, auth.MintOptions{Subject: "a", Tenant: "t", Now: time.Now().Add(-2 * time.Hour)})
		if _, err := gw.Verify(tok); !errors.Is(err, auth.ErrInvalid) {
			t.Errorf("expired token: %v", err)
		}
	})

	t.Run("mint needs subject and tenant", func(t *testing.T) {
		for _, o := range []auth.MintOptions{{Tenant: "t"}, {Subject: "s"}, {}} {
			if tok, err := s.Mint(o); err == nil {
				t.Errorf("Mint(%+v) = %s, want an error", o, tok)
			}
		}
	})
}

func header(t *testing.T, tok string) map[string]any {
	t.Helper()
	seg, _, _ := strings.Cut(tok, ".")
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]any
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestScopeFor(t *testing.T) {
	for class, want := range map[string]string{
		"read_only":   auth.ScopeReadOnly,
		"mutating":    auth.ScopeMutating,
		"destructive": auth.ScopeDestructive,
		"":            "",
		"READ_ONLY":   "",
		"admin":       "",
		"read_only ":  "",
	} {
		if got := auth.ScopeFor(class); got != want {
			t.Errorf("ScopeFor(%q) = %q, want %q", class, got, want)
		}
	}
}

func TestHasScope(t *testing.T) {
	for _, tc := range []struct {
		scope, want string
		ok          bool
	}{
		{"tools:call:read_only", auth.ScopeReadOnly, true},
		{"  device:connect   tools:call:read_only ", auth.ScopeReadOnly, true},
		{"tools:call:read_only\tdevice:connect", auth.ScopeDeviceConnect, false}, // spaces only, RFC 6749 §3.3
		{"tools:call:read_only_extra", auth.ScopeReadOnly, false},
		{"tools:call:read", auth.ScopeReadOnly, false},
		{"tools:call:*", auth.ScopeReadOnly, false},
		{"TOOLS:CALL:READ_ONLY", auth.ScopeReadOnly, false},
		{"", auth.ScopeReadOnly, false},
		{"", "", false},
		{" ", "", false},
		{"tools:call:read_only", "", false},
	} {
		c := &auth.Claims{Scope: tc.scope}
		if got := c.HasScope(tc.want); got != tc.ok {
			t.Errorf("Claims{Scope: %q}.HasScope(%q) = %v, want %v", tc.scope, tc.want, got, tc.ok)
		}
	}
}

func TestLoadOrCreateSigner(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data", "nested")
	s1, err := auth.LoadOrCreateSigner(dir)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, auth.KeyFile)
	fi, err := os.Stat(key)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("key file mode %v, want 0600", mode)
	}
	di, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if mode := di.Mode().Perm(); mode&0o077 != 0 {
		t.Errorf("data dir mode %v, want no group/other access", mode)
	}

	// The public key file holds the signer's public key.
	b, err := os.ReadFile(filepath.Join(dir, auth.PubKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		t.Fatalf("public key file is not a PEM public key: %q", b)
	}
	pk, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if epk, ok := pk.(ed25519.PublicKey); !ok || !epk.Equal(s1.Public()) {
		t.Errorf("public key file holds %T, not the signer's key", pk)
	}

	// A second call loads the same key.
	s2, err := auth.LoadOrCreateSigner(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s1.KeyID() != s2.KeyID() || !s1.Public().Equal(s2.Public()) {
		t.Errorf("second load: key %s, want %s", s2.KeyID(), s1.KeyID())
	}
	if s1.KeyID() == "" {
		t.Error("empty key id")
	}
	tok := mint(t, s1, auth.MintOptions{Subject: "a", Tenant: "t"})
	if _, err := auth.NewVerifier(s2.Public(), auth.AudienceGateway).Verify(tok); err != nil {
		t.Errorf("token of the first signer fails with the second's key: %v", err)
	}

	// Another directory is another key.
	s3 := newSigner(t)
	if s3.KeyID() == s1.KeyID() {
		t.Error("two fresh directories share a key")
	}
}

func TestLoadOrCreateSignerBadKey(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKCS8PrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{
		"empty":     nil,
		"not PEM":   []byte("hello"),
		"bad DER":   pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
		"ECDSA key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER}),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, auth.KeyFile), content, 0o600); err != nil {
				t.Fatal(err)
			}
			if s, err := auth.LoadOrCreateSigner(dir); err == nil {
				t.Fatalf("loaded a signer %s from a bad key file", s.KeyID())
			}
			// The bad file is left alone, never silently replaced.
			got, _ := os.ReadFile(filepath.Join(dir, auth.KeyFile))
			if string(got) != string(content) {
				t.Error("bad key file was rewritten")
			}
		})
	}
}

// Processes starting together on one fresh data directory agree on a key.
func TestLoadOrCreateSignerConcurrent(t *testing.T) {
	for range 50 {
		dir := filepath.Join(t.TempDir(), "data")
		const n = 8
		var (
			wg      sync.WaitGroup
			signers [n]*auth.Signer
			errs    [n]error
		)
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				signers[i], errs[i] = auth.LoadOrCreateSigner(dir)
			})
		}
		close(start)
		wg.Wait()
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("call %d: %v", i, errs[i])
			}
			if signers[i].KeyID() != signers[0].KeyID() {
				t.Fatalf("call %d: key %s, call 0: key %s", i, signers[i].KeyID(), signers[0].KeyID())
			}
		}
		final, err := auth.LoadOrCreateSigner(dir)
		if err != nil {
			t.Fatal(err)
		}
		if final.KeyID() != signers[0].KeyID() {
			t.Fatalf("key on disk %s, callers got %s", final.KeyID(), signers[0].KeyID())
		}
	}
}

// TestVerifyReasons: each refusal says why in one clause a person can act
// on, after one "invalid token: ".
func TestVerifyReasons(t *testing.T) {
	now := time.Now()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, otherPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(pub, auth.AudienceGateway)
	with := func(k string, val any) jwt.MapClaims { return claimsWith(now, k, val) }
	ed := func(c jwt.MapClaims) string { return signWith(t, jwt.SigningMethodEdDSA, priv, c) }
	expired := now.Add(-time.Hour).Truncate(time.Second)
	for tok, want := range map[string]string{
		ed(with("exp", expired.Unix())):                                    "it expired at " + expired.UTC().Format(time.RFC3339) + "; mint a new one",
		signWith(t, jwt.SigningMethodEdDSA, otherPriv, validClaims(now)):   "key this server does not know",
		ed(with("aud", []string{auth.AudienceDevice})):                     "not meant for this server (its audience is not okso-mcp)",
		signWith(t, jwt.SigningMethodHS256, []byte(pub), validClaims(now)): "its signing algorithm is not EdDSA",
		"not a token": "it is not a well-formed JWT",
		ed(with("nbf", now.Add(time.Hour).Unix())): "it is not valid yet",
		ed(with("exp", nil)):                       "it has no expiry (exp)",
		ed(with("tenant", "a.b")):                  "its tenant is missing or malformed",
	} {
		_, err := v.Verify(tok)
		if err == nil {
			t.Fatalf("accepted, want %q", want)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "invalid token: ") || strings.Count(msg, "invalid token") != 1 || !strings.Contains(msg, want) {
			t.Errorf("%q: want one \"invalid token: \" and %q", msg, want)
		}
	}
}

func TestScopesImply(t *testing.T) {
	for _, c := range []struct {
		granted string
		want    map[string]bool
	}{
		{auth.ScopeReadOnly, map[string]bool{auth.ScopeReadOnly: true}},
		{auth.ScopeMutating, map[string]bool{auth.ScopeReadOnly: true, auth.ScopeMutating: true}},
		{auth.ScopeDestructive, map[string]bool{auth.ScopeReadOnly: true, auth.ScopeMutating: true, auth.ScopeDestructive: true}},
		{auth.ScopeDeviceConnect, map[string]bool{auth.ScopeDeviceConnect: true}},
		{"tools:call:other " + auth.ScopeDeviceConnect, map[string]bool{auth.ScopeDeviceConnect: true, "tools:call:other": true}},
		{"  " + auth.ScopeReadOnly + "  ", map[string]bool{auth.ScopeReadOnly: true}},
		// Scopes are separated by spaces only (RFC 6749 §3.3).
		{auth.ScopeDeviceConnect + "\t" + auth.ScopeReadOnly, nil},
		{auth.ScopeReadOnly + "\u00a0" + auth.ScopeDestructive, nil},
		{auth.ScopeReadOnly + "\n", nil},
	} {
		claims := &auth.Claims{Scope: c.granted}
		for _, s := range []string{auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive, auth.ScopeDeviceConnect, "tools:call:other", ""} {
			if got := claims.HasScope(s); got != c.want[s] {
				t.Errorf("%q HasScope(%q) = %v, want %v", c.granted, s, got, c.want[s])
			}
		}
	}
}

// TestMintToolNames: the tool_names claim is minted as asked, read back
// by the verifier, and a form okso does not know is refused at once.
func TestMintToolNames(t *testing.T) {
	s, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(s.Public(), auth.AudienceGateway)
	for _, form := range []string{"", auth.ToolNamesSafe, auth.ToolNamesSeed} {
		tok, err := s.Mint(auth.MintOptions{Subject: "a", Tenant: "demo", ToolNames: form})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(tok)
		if err != nil || c.ToolNames != form {
			t.Errorf("minted with tool names %q: verified %+v, %v", form, c, err)
		}
	}
	if _, err := s.Mint(auth.MintOptions{Subject: "a", Tenant: "demo", ToolNames: "dots"}); err == nil ||
		!strings.Contains(err.Error(), `unknown tool names form "dots"`) {
		t.Errorf("mint with tool names dots: %v", err)
	}
}

// TestNodeToolsClaim: the node_tools claim is minted as asked (absent,
// false, true), read back by the verifier as minted, and a claim that is
// not a boolean is refused with a reason that names it.
func TestNodeToolsClaim(t *testing.T) {
	s, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := auth.NewVerifier(s.Public(), auth.AudienceGateway)
	no, yes := false, true
	for _, want := range []*bool{nil, &no, &yes} {
		tok, err := s.Mint(auth.MintOptions{Subject: "a", Tenant: "demo", NodeTools: want})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(tok)
		if err != nil {
			t.Fatalf("minted with node tools %v: %v", want, err)
		}
		if (c.NodeTools == nil) != (want == nil) || want != nil && *c.NodeTools != *want {
			t.Errorf("minted with node tools %v: verified %v", fmtBool(want), fmtBool(c.NodeTools))
		}
	}

	now := time.Now()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pv := auth.NewVerifier(priv.Public().(ed25519.PublicKey), auth.AudienceGateway)
	tok := signWith(t, jwt.SigningMethodEdDSA, priv, claimsWith(now, "node_tools", "false"))
	if _, err := pv.Verify(tok); err == nil || !strings.Contains(err.Error(), "node_tools claim is not a boolean") {
		t.Errorf("node_tools \"false\" (a string): %v", err)
	}
}

func fmtBool(b *bool) string {
	if b == nil {
		return "absent"
	}
	return strconv.FormatBool(*b)
}

func TestMintRefusesUnknownScope(t *testing.T) {
	s, err := auth.LoadOrCreateSigner(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Mint(auth.MintOptions{Subject: "a", Tenant: "demo", Scopes: []string{"tools:call:readonly"}})
	if err == nil || !strings.Contains(err.Error(), `unknown scope "tools:call:readonly"`) {
		t.Errorf("mint with a misspelt scope: %v", err)
	}
}
