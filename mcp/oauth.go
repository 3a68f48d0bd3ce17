package mcp

// okso's own OAuth 2.1 authorization server (DESIGN.md §6, --oauth-server):
// RFC 8414 metadata, authorization code with PKCE S256 only, RFC 8707
// resource indicators, RFC 9207 iss in the authorization response,
// clients by Client ID Metadata Documents or RFC 7591 registration, and
// consent approved out of band by the operator (okso oauth approve). Its
// state lives in the bucket okso_oauth, shared by every replica.
//
// Written on golang-jwt and the standard library rather than an OAuth
// framework: the ones the module proxy offers (zitadel/oidc's op) keep
// sessions behind storage interfaces of their own, want an interactive
// login page and do not know resource indicators or CIMD; okso's model
// (KV state across replicas, out-of-band consent, S256 only) is a few
// hundred lines on its own.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/time/rate"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/jsonscan"
)

// The authorization server's paths, under the gateway's URL.
const (
	OAuthMetadataPath  = "/.well-known/oauth-authorization-server"
	OAuthAuthorizePath = "/oauth/authorize"
	OAuthTokenPath     = "/oauth/token"
	OAuthRegisterPath  = "/oauth/register"
	OAuthJWKSPath      = "/oauth/jwks"
)

// OAuth error codes (RFC 6749 §4.1.2.1, §5.2; RFC 7591 §3.2.2; RFC 8707 §2).
const (
	oauthInvalidRequest       = "invalid_request"
	oauthInvalidClient        = "invalid_client"
	oauthInvalidGrant         = "invalid_grant"
	oauthUnauthorizedClient   = "unauthorized_client"
	oauthUnsupportedGrantType = "unsupported_grant_type"
	oauthUnsupportedResponse  = "unsupported_response_type"
	oauthInvalidScope         = "invalid_scope"
	oauthInvalidTarget        = "invalid_target"
	oauthAccessDenied         = "access_denied"
	oauthServerError          = "server_error"
	oauthTemporarilyDown      = "temporarily_unavailable"
	oauthInvalidRedirectURI   = "invalid_redirect_uri"
	oauthInvalidClientMeta    = "invalid_client_metadata"
)

// OAuthServerOptions configure [NewOAuthServer]. Store and Signer are
// required; every other zero value means the default.
type OAuthServerOptions struct {
	Store *bus.OAuthStore
	// Signer is the authorization server's own key (not okso's signing
	// key, which can mint device tokens): a gateway never holds that one.
	Signer *auth.Signer
	// AccessTTL is the life of an access token (1 h); RefreshTTL of a
	// grant, from its last refresh (30 days); RequestTTL of an
	// authorization request, the time the operator has to approve it
	// (10 min); CodeTTL of an authorization code (1 min); ClientTTL of a
	// registered client from its first grant (90 days: then it registers
	// again; one never granted lives an hour).
	AccessTTL, RefreshTTL, RequestTTL, CodeTTL, ClientTTL time.Duration
	// MaxClients caps the registered clients (1000); Registrations and
	// RegistrationBurst bound their rate per replica (1 a second, 20 at
	// once).
	MaxClients        int
	Registrations     rate.Limit
	RegistrationBurst int
	// CIMD is how client metadata documents are fetched (zero value: the
	// safe defaults).
	CIMD CIMDOptions
	// Auditor, when set, records each grant made, refreshed or revoked
	// for a reuse, on its tenant's audit subject.
	Auditor *bus.Auditor
	// Now is the clock (time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// OAuthServer is okso's authorization server, served by a [Gateway]
// (Options.OAuth) next to /mcp, whose access tokens the gateway accepts.
// It is safe for concurrent use.
type OAuthServer struct {
	o        OAuthServerOptions
	log      *slog.Logger
	register *rate.Limiter
	// requests bounds the authorization requests this replica keeps in
	// the bucket: anyone may open the page, and each good one is a
	// record. It is taken only after the request was checked.
	requests *rate.Limiter
	cimd     *cimdFetcher

	// Verifiers of its access tokens, one per audience (the resource
	// URL: one with --public-url, else one per host clients name).
	verifyMu  sync.Mutex
	verifiers map[string]*auth.Verifier
	// grants whose liveness was checked recently: a revoked grant's
	// access tokens are refused within grantRecheck.
	grantMu sync.Mutex
	grants  map[string]grantSeen
	// goneHook, when set (tests), is told of each grant Run saw go.
	goneHook func(grant string)
}

type grantSeen struct {
	at   time.Time
	live bool
}

// requestRate and requestBurst bound the authorization requests a
// replica keeps: people sign in a few times a day, not thousands of
// times a second.
const (
	requestRate  = 5
	requestBurst = 100
)

// grantRecheck is how long a grant's liveness is trusted at /mcp before
// it is read again: a refresh token reused or okso oauth revoke takes
// its access tokens away within it.
const grantRecheck = 10 * time.Second

// NewOAuthServer checks o and builds the authorization server.
func NewOAuthServer(o OAuthServerOptions) (*OAuthServer, error) {
	if o.Store == nil || o.Signer == nil {
		return nil, errors.New("oauth server: Store and Signer are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.AccessTTL, time.Hour)
	def(&o.RefreshTTL, 30*24*time.Hour)
	def(&o.RequestTTL, 10*time.Minute)
	def(&o.CodeTTL, time.Minute)
	def(&o.ClientTTL, 90*24*time.Hour)
	if o.MaxClients <= 0 {
		o.MaxClients = 1000
	}
	if o.Registrations <= 0 {
		o.Registrations = 1
	}
	if o.RegistrationBurst <= 0 {
		o.RegistrationBurst = 20
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &OAuthServer{
		o: o, log: log,
		register:  rate.NewLimiter(o.Registrations, o.RegistrationBurst),
		requests:  rate.NewLimiter(requestRate, requestBurst),
		cimd:      newCIMDFetcher(o.CIMD, o.Now),
		verifiers: map[string]*auth.Verifier{},
		grants:    map[string]grantSeen{},
	}, nil
}

// routes adds the server's endpoints to mux; base is the gateway's URL
// for a request (its issuer).
func (s *OAuthServer) routes(mux *http.ServeMux, base func(*http.Request) string) {
	meta := func(w http.ResponseWriter, r *http.Request) { s.serveMetadata(w, r, base(r)) }
	mux.Handle(OAuthMetadataPath, cors(meta))
	mux.Handle(OAuthMetadataPath+"/mcp", cors(meta))
	mux.Handle(OAuthJWKSPath, cors(s.serveJWKS))
	mux.Handle(OAuthRegisterPath, cors(s.serveRegister))
	mux.HandleFunc(OAuthAuthorizePath, func(w http.ResponseWriter, r *http.Request) { s.serveAuthorize(w, r, base(r)) })
	mux.Handle(OAuthTokenPath, cors(func(w http.ResponseWriter, r *http.Request) { s.serveToken(w, r, base(r)) }))
}

// cors lets MCP clients that run in a browser (the Inspector's web UI)
// discover, register and get tokens: these endpoints take no cookie and
// answer only what their request's own parameters earn, so any origin
// may read the answers. The authorize page, which has a cookie, has none.
func cors(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			w.Header().Set("Access-Control-Allow-Methods", "GET, POST")
			w.Header().Set("Access-Control-Allow-Headers", "Content-Type, Authorization, MCP-Protocol-Version")
			w.Header().Set("Access-Control-Max-Age", "3600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		h(w, r)
	})
}

// resourceOf is the resource a gateway's tokens are for: its MCP
// endpoint (RFC 8707).
func resourceOf(base string) string { return base + "/mcp" }

func (s *OAuthServer) metadata(base string) *oauthex.AuthServerMeta {
	return &oauthex.AuthServerMeta{
		Issuer:                                     base,
		AuthorizationEndpoint:                      base + OAuthAuthorizePath,
		TokenEndpoint:                              base + OAuthTokenPath,
		JWKSURI:                                    base + OAuthJWKSPath,
		RegistrationEndpoint:                       base + OAuthRegisterPath,
		ScopesSupported:                            []string{auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive},
		ResponseTypesSupported:                     []string{"code"},
		ResponseModesSupported:                     []string{"query"},
		GrantTypesSupported:                        []string{"authorization_code", "refresh_token"},
		TokenEndpointAuthMethodsSupported:          []string{"none"},
		CodeChallengeMethodsSupported:              []string{"S256"},
		ClientIDMetadataDocumentSupported:          true,
		AuthorizationResponseIssParameterSupported: true,
	}
}

func (s *OAuthServer) serveMetadata(w http.ResponseWriter, r *http.Request, base string) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		oauthError(w, http.StatusMethodNotAllowed, oauthInvalidRequest, "use GET")
		return
	}
	writeJSON(w, http.StatusOK, s.metadata(base))
}

func (s *OAuthServer) serveJWKS(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		oauthError(w, http.StatusMethodNotAllowed, oauthInvalidRequest, "use GET")
		return
	}
	pub := s.o.Signer.Public()
	writeJSON(w, http.StatusOK, map[string]any{"keys": []map[string]string{{
		"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
		"kid": s.o.Signer.KeyID(), "x": base64.RawURLEncoding.EncodeToString(pub),
	}}})
}

// Issued reports whether token claims to be signed by this server's key
// (its kid): whether [OAuthServer.Verify], not okso's verifier, is the
// one to ask. Nothing is verified.
func (s *OAuthServer) Issued(token string) bool { return s.issuedKid(token, s.o.Signer.KeyID()) }

// issuedKid reports whether token's header names key id kid. Every
// bearer token at /mcp is asked this, so the header is read in one pass
// (see headerNamesKid).
func (s *OAuthServer) issuedKid(token, kid string) bool {
	head, _, ok := strings.Cut(token, ".")
	if !ok || len(head) > 1024 {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return false
	}
	return headerNamesKid(b, kid)
}

// headerNamesKid reports whether the JSON document b decodes, as
// json.Unmarshal decodes it into a struct with a string field Kid, to a
// Kid equal to kid. It reads a header of plain keys in one pass (its
// exact "kid" a plain string, the other members valid) and leaves
// anything else, a key that is "kid" in another case among them, to
// json.Unmarshal (FuzzHeaderNamesKid).
func headerNamesKid(b []byte, kid string) bool {
	var got []byte
	if jsonscan.Members(b, func(k, v []byte) (ok bool) {
		switch {
		case string(k) == "kid": // the last wins, as in json.Unmarshal
			got, ok = jsonscan.StringBytes(v)
			return ok
		case len(k) == len("kid") && strings.EqualFold(string(k), "kid"):
			return false
		}
		return jsonscan.Value(v)
	}) {
		return string(got) == kid
	}
	var h struct {
		Kid string `json:"kid"`
	}
	return json.Unmarshal(b, &h) == nil && h.Kid == kid
}

// Verify checks an access token this server issued for the gateway at
// base: signature, expiry, issuer base, audience base's /mcp, and that
// its grant was not revoked (read again at most every grantRecheck).
func (s *OAuthServer) Verify(ctx context.Context, token, base string) (*auth.Claims, error) {
	resource := resourceOf(base)
	s.verifyMu.Lock()
	v := s.verifiers[resource]
	if v == nil {
		if len(s.verifiers) >= maxMetadataHosts {
			clear(s.verifiers)
		}
		v = auth.NewVerifier(s.o.Signer.Public(), resource)
		s.verifiers[resource] = v
	}
	s.verifyMu.Unlock()
	c, err := v.Verify(token)
	if err != nil {
		return nil, err
	}
	if c.Issuer != base {
		return nil, fmt.Errorf("%w: it was issued by %s, not this server's authorization server", auth.ErrInvalid, c.Issuer)
	}
	_, grant, ok := subjectGrant(c.Subject)
	if !ok {
		return nil, fmt.Errorf("%w: its subject is not an OAuth grant's", auth.ErrInvalid)
	}
	live, err := s.grantLive(ctx, grant)
	if err != nil {
		return nil, fmt.Errorf("%w: its grant cannot be checked now (%v); try again", auth.ErrInvalid, err)
	}
	if !live {
		return nil, fmt.Errorf("%w: its grant was revoked; sign in again", auth.ErrInvalid)
	}
	return c, nil
}

// grantLive reports whether grant still exists, from what was read of it
// within grantRecheck. When the bucket cannot be read, a grant seen live
// stays so (a NATS outage does not sign every agent out); one never seen
// is refused with the error.
func (s *OAuthServer) grantLive(ctx context.Context, grant string) (bool, error) {
	now := s.o.Now()
	s.grantMu.Lock()
	seen, ok := s.grants[grant]
	s.grantMu.Unlock()
	if ok && now.Sub(seen.at) < grantRecheck {
		return seen.live, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _, err := s.o.Store.Get(ctx, bus.OAuthGrant, grant)
	live := err == nil
	if err != nil && !errors.Is(err, bus.ErrOAuthNotFound) {
		s.log.Warn("oauth: read grant", "grant", grant, "err", err)
		if !ok {
			return false, err
		}
		live = seen.live
	}
	s.grantMu.Lock()
	defer s.grantMu.Unlock()
	if cur, ok := s.grants[grant]; ok && !cur.live && !cur.at.Before(now) {
		return false, nil // revoked (forget) while it was being read
	}
	if len(s.grants) >= maxTokenInfos {
		clear(s.grants)
	}
	s.grants[grant] = grantSeen{at: now, live: live}
	return live, nil
}

// Audit codes of the authorization server's decisions.
const (
	auditGrant    = "oauth_grant"
	auditRefresh  = "oauth_refresh"
	auditReplayed = "oauth_code_replayed"
	auditReused   = "oauth_refresh_reused"
)

// audit records a decision on grant g (the auditor drops it when unset).
func (s *OAuthServer) audit(decision, code, tenant, client, grant, jti string) {
	s.o.Auditor.Record(bus.AuditEvent{Actor: "gateway", Tenant: tenant, Subject: oauthSubject(client, grant), JTI: jti,
		Decision: decision, Code: code})
}

// Run follows the grants revoked at any replica until ctx ends, so that
// their access tokens are refused here at once rather than within
// grantRecheck. A watch that fails is logged and started again a second
// later. It returns nil once ctx ends.
func (s *OAuthServer) Run(ctx context.Context) error {
	for {
		err := s.o.Store.WatchGone(ctx, bus.OAuthGrant, func(grant string) {
			s.forget(grant)
			if s.goneHook != nil {
				s.goneHook(grant)
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("oauth: watch of revoked grants ended, following again in 1s", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// forget drops what this replica knows of grant: revoked here, it is
// refused at once.
func (s *OAuthServer) forget(grant string) {
	s.grantMu.Lock()
	if len(s.grants) >= maxTokenInfos {
		clear(s.grants)
	}
	s.grants[grant] = grantSeen{at: s.o.Now(), live: false}
	s.grantMu.Unlock()
}

// Subject is the sub of the access tokens of a grant.
func oauthSubject(clientID, grant string) string {
	return auth.OAuthServerName + ":" + clientID + ":" + grant
}

// subjectGrant splits an access token's subject into client id and
// grant id (the client id may hold colons: a URL).
func subjectGrant(sub string) (client, grant string, ok bool) {
	rest, ok := strings.CutPrefix(sub, auth.OAuthServerName+":")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || i == len(rest)-1 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// randomToken is 32 random bytes, base64url: codes, refresh tokens,
// CSRF tokens.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// hashToken is how a secret is kept in the bucket: its SHA-256,
// base64url (a valid key id).
func hashToken(t string) string {
	sum := sha256.Sum256([]byte(t))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// oauthError writes an OAuth error answer (RFC 6749 §5.2).
func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// mint signs an access token of grant g for the gateway at base.
func (s *OAuthServer) mint(g *OAuthGrant, base string) (token, jti string, exp time.Time, err error) {
	now := s.o.Now()
	token, err = s.o.Signer.Mint(auth.MintOptions{
		Issuer:   base,
		Subject:  oauthSubject(g.ClientID, g.ID),
		Tenant:   g.Tenant,
		Scopes:   strings.Fields(g.Scope),
		Audience: g.Resource,
		TTL:      s.o.AccessTTL,
		Now:      now,
	})
	if err != nil {
		return "", "", time.Time{}, err
	}
	c, err := auth.UnverifiedClaims(token)
	if err != nil {
		return "", "", time.Time{}, err
	}
	return token, c.ID, now.Add(s.o.AccessTTL), nil
}
