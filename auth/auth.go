// Package auth mints and verifies okso's JSON Web Tokens (EdDSA by default)
// and names the scopes that guard tools and device connections.
//
// A [Signer] holds the Ed25519 key kept in a data directory
// ([LoadOrCreateSigner]); a [Verifier] checks signature, algorithm,
// audience, expiry and okso's own claims. Both are safe for concurrent use.
package auth

import (
	"cmp"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/oklog/ulid/v2"
)

// Scopes (DESIGN.md §5).
const (
	ScopeReadOnly      = "tools:call:read_only"
	ScopeMutating      = "tools:call:mutating"
	ScopeDestructive   = "tools:call:destructive"
	ScopeDeviceConnect = "device:connect"
)

// Default audiences: agent tokens are for the gateway, device tokens for the tier.
const (
	AudienceGateway = "okso-mcp"
	AudienceDevice  = "okso-device"
	Issuer          = "okso"
)

// Key files inside a data directory.
const (
	KeyFile    = "signing.key"
	PubKeyFile = "signing.pub"
)

// ScopeFor returns the scope a caller needs for a safety class, and "" for
// an unknown class (which nothing may call: deny by default).
func ScopeFor(safetyClass string) string {
	switch safetyClass {
	case "read_only":
		return ScopeReadOnly
	case "mutating":
		return ScopeMutating
	case "destructive":
		return ScopeDestructive
	}
	return ""
}

// Claims are the claims of an okso token.
type Claims struct {
	jwt.RegisteredClaims
	Tenant string `json:"tenant"`
	Scope  string `json:"scope,omitempty"` // space separated
	// ToolNames, when set, is the form in which the gateway lists tools
	// to this agent ([ToolNamesSafe] or [ToolNamesSeed]), whatever the
	// gateway's own setting.
	ToolNames string `json:"tool_names,omitempty"`
	// NodeTools, when set, says whether the gateway lists the per-node
	// device tools to this agent, whatever the gateway's own setting;
	// false keeps its tools/list lean (the tools stay callable by name).
	// A claim that is not a boolean is refused at verification.
	NodeTools *bool `json:"node_tools,omitempty"`
	// Labels, in a device token, are the operator's labels for the
	// node: they win over the ones the device announces, key by key.
	// auth does not check them; the tier does, by the label rules.
	Labels map[string]string `json:"labels,omitempty"`
}

// The forms of listed tool names (DESIGN.md §8): safe replaces each dot of
// a canonical name with a dash, for the agent hosts that accept only
// ^[A-Za-z0-9_-]{1,64}$; seed is seed 000's dotted canonical form.
const (
	ToolNamesSafe = "safe"
	ToolNamesSeed = "seed"
)

// ValidToolNames reports whether s names a form of listed tool names.
func ValidToolNames(s string) bool { return s == ToolNamesSafe || s == ToolNamesSeed }

// callScopes are the call scopes from the weakest up: each implies the
// ones before it (destructive ⊃ mutating ⊃ read_only, DESIGN.md §5).
var callScopes = [...]string{ScopeReadOnly, ScopeMutating, ScopeDestructive}

// callRank is the place of s in callScopes, from 1; 0 for another scope.
func callRank(s string) int {
	for i, c := range callScopes {
		if c == s {
			return i + 1
		}
	}
	return 0
}

// KnownScope reports whether s is one of okso's scopes.
func KnownScope(s string) bool { return callRank(s) > 0 || s == ScopeDeviceConnect }

// HasScope reports whether the token grants scope s: the scope itself or,
// for a call scope, one that implies it.
func (c *Claims) HasScope(s string) bool {
	if s == "" {
		return false
	}
	want := callRank(s)
	for f := range strings.SplitSeq(c.Scope, " ") {
		if f == s || (want > 0 && callRank(f) >= want) {
			return true
		}
	}
	return false
}

// Scopes returns the granted scopes. The scope claim is split on spaces
// only (RFC 6749 §3.3): a tab or a no-break space is part of a scope
// name, which then names no scope of okso's.
func (c *Claims) Scopes() []string {
	var scopes []string
	for f := range strings.SplitSeq(c.Scope, " ") {
		if f != "" {
			scopes = append(scopes, f)
		}
	}
	return scopes
}

// Signer signs tokens with an Ed25519 key.
type Signer struct {
	key ed25519.PrivateKey
	kid string
}

// LoadOrCreateSigner reads the signing key in dir, creating the directory
// and a fresh key on first use.
func LoadOrCreateSigner(dir string) (*Signer, error) {
	path := filepath.Join(dir, KeyFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return createSigner(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("read signing key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("signing key %s: not PEM", path)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s: not an Ed25519 key", path)
	}
	return newSigner(ek), nil
}

func createSigner(dir string) (*Signer, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return nil, err
	}
	// The key is written whole to a temporary file, then linked into place:
	// when two processes start on one fresh data dir, one key wins, and the
	// other never reads a half-written file.
	path := filepath.Join(dir, KeyFile)
	f, err := os.CreateTemp(dir, "."+KeyFile+"-*")
	if err != nil {
		return nil, fmt.Errorf("write signing key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("write signing key: %w", err)
	}
	err = os.Link(tmp, path)
	if errors.Is(err, os.ErrExist) {
		return LoadOrCreateSigner(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("write signing key: %w", err)
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	if err := os.WriteFile(filepath.Join(dir, PubKeyFile), pub, 0o644); err != nil {
		return nil, fmt.Errorf("write public key: %w", err)
	}
	return newSigner(priv), nil
}

func newSigner(k ed25519.PrivateKey) *Signer {
	return &Signer{key: k, kid: KeyID(k.Public().(ed25519.PublicKey))}
}

// Public returns the verification key.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// KeyID returns the key id put in the kid header of every token.
func (s *Signer) KeyID() string { return s.kid }

// MintOptions describe one token. Audience defaults to [AudienceGateway]
// and TTL to one hour.
type MintOptions struct {
	Subject  string
	Tenant   string
	Scopes   []string
	Audience string
	TTL      time.Duration
	Now      time.Time // zero: the current time
	// ToolNames sets the tool_names claim ("": none, the gateway decides).
	ToolNames string
	// NodeTools sets the node_tools claim (nil: none, the gateway decides).
	NodeTools *bool
	// Labels of a device token's node (the claim labels); nil: none.
	Labels map[string]string
	// Issuer is the iss claim ("": [Issuer]): okso's authorization
	// server names itself by its URL.
	Issuer string
}

// Mint signs a token.
func (s *Signer) Mint(o MintOptions) (string, error) {
	if o.Subject == "" || o.Tenant == "" {
		return "", errors.New("mint token: subject and tenant are required")
	}
	if o.Audience == "" {
		o.Audience = AudienceGateway
	}
	if o.TTL <= 0 {
		o.TTL = time.Hour
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	if o.ToolNames != "" && !ValidToolNames(o.ToolNames) {
		return "", fmt.Errorf("mint token: unknown tool names form %q (want %s or %s)", o.ToolNames, ToolNamesSafe, ToolNamesSeed)
	}
	for _, sc := range o.Scopes {
		if !KnownScope(sc) {
			return "", fmt.Errorf("mint token: unknown scope %q (want %s, %s, %s or %s)",
				sc, ScopeReadOnly, ScopeMutating, ScopeDestructive, ScopeDeviceConnect)
		}
	}
	c := Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    cmp.Or(o.Issuer, Issuer),
			Subject:   o.Subject,
			Audience:  jwt.ClaimStrings{o.Audience},
			ExpiresAt: jwt.NewNumericDate(now.Add(o.TTL)),
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now.Add(-time.Second)),
			ID:        strings.ToLower(ulid.Make().String()),
		},
		Tenant:    o.Tenant,
		Scope:     strings.Join(o.Scopes, " "),
		ToolNames: o.ToolNames,
		NodeTools: o.NodeTools,
		Labels:    o.Labels,
	}
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
	t.Header["kid"] = s.kid
	return t.SignedString(s.key)
}

// ErrInvalid is wrapped by every verification failure.
var ErrInvalid = errors.New("invalid token")

var tenantRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Verifier checks tokens for one audience. The zero value is not usable;
// call [NewVerifier].
type Verifier struct {
	key      ed25519.PublicKey            // the current key
	keys     map[string]ed25519.PublicKey // every accepted key, by kid
	audience string
	parser   *jwt.Parser

	// A client sends the same token on every request: its verified claims
	// are kept (until the token expires) so the signature is checked once.
	cache verified
}

// leeway is the clock skew tolerated on exp, nbf and iat.
const leeway = 5 * time.Second

// verifiedCacheSize bounds the cache of verified tokens; it is emptied
// when full.
const verifiedCacheSize = 4096

// KeyID returns the key id okso gives an Ed25519 public key (the kid
// header of the tokens it signs).
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// NewKeySetVerifier returns a verifier that accepts tokens signed by any of
// keys, chosen by the token's kid header (a token without kid is checked
// against current). Keys rotate without downtime: verifiers accept the old
// and the new key while tokens of both are alive.
func NewKeySetVerifier(current ed25519.PublicKey, keys []ed25519.PublicKey, audience string) *Verifier {
	v := NewVerifier(current, audience)
	for _, k := range keys {
		v.keys[KeyID(k)] = k
	}
	return v
}

// NewVerifier returns a verifier of EdDSA tokens signed by key for audience.
// Only EdDSA is accepted: "none" and HMAC tokens (the key-confusion attack)
// are refused before any signature check.
func NewVerifier(key ed25519.PublicKey, audience string) *Verifier {
	return &Verifier{
		key:      key,
		keys:     map[string]ed25519.PublicKey{KeyID(key): key},
		audience: audience,
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}),
			jwt.WithAudience(audience),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(leeway),
		),
	}
}

// Verify parses and checks a token and returns its claims. Every failure
// wraps [ErrInvalid].
func (v *Verifier) Verify(token string) (*Claims, error) {
	if len(token) > 8192 {
		return nil, fmt.Errorf("%w: it is longer than 8192 bytes", ErrInvalid)
	}
	if c, ok := v.cache.get(token); ok {
		return c, nil
	}
	c, err := v.verify(token)
	if err != nil {
		return nil, err
	}
	v.cache.put(token, c)
	cc := *c
	return &cc, nil
}

// Cached reports whether token was verified and has not expired since,
// with its id (jti): a cheap look at the cache of [Verifier.Verify], for a
// caller that only wants to know whether Verify would accept it.
func (v *Verifier) Cached(token string) (jti string, ok bool) { return v.cache.jti(token) }

// verified keeps the claims of verified tokens, by token, until they
// expire, at most [verifiedCacheSize] of them (it is emptied when full).
// The zero value is an empty cache; it is safe for concurrent use.
type verified struct {
	mu sync.Mutex
	m  map[string]*Claims
}

// get returns a copy of a kept token's claims, if it has not expired.
func (c *verified) get(token string) (*Claims, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.m[token]
	if !ok {
		return nil, false
	}
	if !time.Now().Before(cl.ExpiresAt.Time.Add(leeway)) {
		delete(c.m, token)
		return nil, false
	}
	cc := *cl // callers get their own copy
	return &cc, true
}

func (c *verified) put(token string, cl *Claims) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= verifiedCacheSize {
		c.m = make(map[string]*Claims)
	}
	c.m[token] = cl
}

func (c *verified) jti(token string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl, ok := c.m[token]
	if !ok || !time.Now().Before(cl.ExpiresAt.Time.Add(leeway)) {
		return "", false
	}
	return cl.ID, true
}

// verify checks a token's signature and claims.
func (v *Verifier) verify(token string) (*Claims, error) {
	var c Claims
	t, err := v.parser.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		kid, _ := t.Header["kid"].(string)
		if kid == "" {
			return v.key, nil
		}
		if k, ok := v.keys[kid]; ok {
			return k, nil
		}
		return nil, errUnknownKey
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, v.reason(err, t, &c))
	}
	switch {
	case c.Subject == "":
		return nil, fmt.Errorf("%w: it has no subject (sub)", ErrInvalid)
	case !tenantRe.MatchString(c.Tenant):
		return nil, fmt.Errorf("%w: its tenant is missing or malformed", ErrInvalid)
	case c.ID == "":
		return nil, fmt.Errorf("%w: it has no token id (jti)", ErrInvalid)
	case c.ToolNames != "" && !ValidToolNames(c.ToolNames):
		return nil, fmt.Errorf("%w: its tool_names claim is neither %s nor %s", ErrInvalid, ToolNamesSafe, ToolNamesSeed)
	}
	return &c, nil
}

// errUnknownKey is the key lookup's failure for a kid no key matches.
var errUnknownKey = errors.New("unknown key id")

// reason words why the parser refused a token, in one clause a person can
// act on; never with text taken from the token but its expiry.
func (v *Verifier) reason(err error, t *jwt.Token, c *Claims) string {
	var alg string
	if t != nil {
		alg, _ = t.Header["alg"].(string)
	}
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typ) && typ.Field == "node_tools":
		return "its node_tools claim is not a boolean"
	case t == nil, errors.Is(err, jwt.ErrTokenMalformed):
		return "it is not a well-formed JWT"
	case alg != jwt.SigningMethodEdDSA.Alg():
		return "its signing algorithm is not EdDSA"
	case errors.Is(err, errUnknownKey), errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "it was signed with a key this server does not know (minted with another --data-dir, " +
			"or before a key rotation whose old key is not in keys/?)"
	case errors.Is(err, jwt.ErrTokenExpired) && c.ExpiresAt != nil:
		return "it expired at " + c.ExpiresAt.UTC().Format(time.RFC3339) + "; mint a new one"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && c.ExpiresAt == nil:
		return "it has no expiry (exp)"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "it is not valid yet (check the clocks)"
	case errors.Is(err, jwt.ErrTokenInvalidAudience), errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "it is not meant for this server (its audience is not " + v.audience + ")"
	}
	return "it is not a well-formed JWT"
}

// UnverifiedClaims returns a token's claims without checking its
// signature: a device reads its own node id from the token it was given,
// an operator the id of a token to revoke. Never use it to make a security
// decision.
func UnverifiedClaims(token string) (*Claims, error) {
	var c Claims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &c); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &c, nil
}

// UnverifiedSubject returns the sub claim of a token without checking its
// signature (see [UnverifiedClaims]).
func UnverifiedSubject(token string) (string, error) {
	c, err := UnverifiedClaims(token)
	if err != nil {
		return "", err
	}
	if c.Subject == "" {
		return "", fmt.Errorf("%w: no subject", ErrInvalid)
	}
	return c.Subject, nil
}

// LoadPublicKey reads the verification key kept in dir (signing.pub), for
// processes that verify tokens but never sign them.
func LoadPublicKey(dir string) (ed25519.PublicKey, error) {
	return LoadPublicKeyFile(filepath.Join(dir, PubKeyFile))
}

// LoadPublicKeyFile reads an Ed25519 public key in PEM (PKIX).
func LoadPublicKeyFile(path string) (ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read public key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("public key %s: not PEM", path)
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key %s: not an Ed25519 key", path)
	}
	return ek, nil
}

// KeysDir is the directory, inside a data dir, of the public keys that are
// still accepted besides the current one (each a PEM file *.pub).
const KeysDir = "keys"

// LoadExtraKeys reads every *.pub in dataDir/keys: keys that verifiers keep
// accepting after a rotation. A missing directory is no key.
func LoadExtraKeys(dataDir string) ([]ed25519.PublicKey, error) {
	paths, err := filepath.Glob(filepath.Join(dataDir, KeysDir, "*.pub"))
	if err != nil {
		return nil, err
	}
	var keys []ed25519.PublicKey
	for _, p := range paths {
		k, err := LoadPublicKeyFile(p)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Rotate makes a new signing key in dataDir, keeping the old public key in
// dataDir/keys so that verifiers which load it accept tokens signed before
// the rotation until they expire. It returns the new signer.
func Rotate(dataDir string) (*Signer, error) {
	old, err := LoadOrCreateSigner(dataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dataDir, KeysDir), 0o700); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(old.Public())
	if err != nil {
		return nil, err
	}
	keep := filepath.Join(dataDir, KeysDir, old.KeyID()+".pub")
	if err := os.WriteFile(keep, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return nil, fmt.Errorf("keep the old public key: %w", err)
	}
	for _, f := range []string{KeyFile, PubKeyFile} {
		if err := os.Remove(filepath.Join(dataDir, f)); err != nil {
			return nil, fmt.Errorf("retire the old key: %w", err)
		}
	}
	return createSigner(dataDir)
}
