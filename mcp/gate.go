package mcp

import (
	"context"
	"net/http"
	"strings"
	"sync"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// gate is the gateway's authentication: it verifies each agent's bearer
// token (one of okso's own authorization server, else one the Verifier
// accepts), refuses a revoked one, and serves the protected-resource
// metadata that tells a client where to get one. New builds it from the
// Options; it is safe for concurrent use.
type gate struct {
	verifier    TokenVerifier                     // Options.Verifier
	revocations interface{ Revoked(string) bool } // Options.Revoked; nil: none
	oauth       *OAuthServer                      // Options.OAuth; nil: none
	servers     []string                          // Options.AuthorizationServers
	publicURL   string                            // Options.PublicURL
	auditor     *bus.Auditor
	// refusals count the requests refused a token, by reason; nil: not
	// counted.
	refusals *prometheus.CounterVec
}

// refused counts a request refused for reason: missing (no bearer
// token), invalid_token, revoked.
func (gt *gate) refused(reason string) {
	if gt.refusals != nil {
		gt.refusals.WithLabelValues(reason).Inc()
	}
}

// TokenVerifier checks agent tokens. Verify returns a token's claims or
// an error wrapping [auth.ErrInvalid] that says why in one sentence;
// Cached is a cheap look at what Verify accepted before, with the token's
// id. Implementations are safe for concurrent use.
type TokenVerifier interface {
	Verify(token string) (*auth.Claims, error)
	Cached(token string) (jti string, ok bool)
}

// baseURL is the gateway's own URL: --public-url, or as the client
// addressed it.
func (gt *gate) baseURL(r *http.Request) string {
	if gt.publicURL != "" {
		return strings.TrimSuffix(gt.publicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// serveResourceMetadata serves the protected-resource metadata (RFC
// 9728): the resource, and where to get a token for it.
func (gt *gate) serveResourceMetadata(w http.ResponseWriter, r *http.Request) {
	base := gt.baseURL(r)
	sdkauth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               base + "/mcp",
		AuthorizationServers:   gt.authorizationServers(base),
		ScopesSupported:        []string{auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive},
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "okso MCP gateway",
	}).ServeHTTP(w, r)
}

// authenticate requires a valid agent token; a missing or invalid one gets
// 401 with WWW-Authenticate pointing at the protected-resource metadata.
//
// The SDK's middleware is built once per metadata URL (one with
// --public-url, else one per host the clients name, up to a bound), and
// each token's TokenInfo once (kept under the bound of the verifier's
// cache): neither changes between requests, and building them cost a
// dozen allocations per call. Every request still has its token verified
// (from the verifier's cache: expiry) and checked for revocation.
func (gt *gate) authenticate(next http.Handler) http.Handler {
	var (
		infoMu sync.Mutex
		infos  = map[string]*sdkauth.TokenInfo{} // by token
	)
	verify := func(ctx context.Context, token string, r *http.Request) (*sdkauth.TokenInfo, error) {
		c, err := gt.verify(ctx, token, r)
		if err != nil {
			// Who sent it is unknown: logged, not published to a tenant.
			gt.auditor.Record(bus.AuditEvent{Actor: "gateway", Decision: bus.DecisionDenied, Code: "invalid_token"})
			gt.refused("invalid_token")
			return nil, tokenError(err.Error())
		}
		if gt.revoked(c) {
			gt.auditor.Record(bus.AuditEvent{Actor: "gateway", Tenant: c.Tenant, Subject: c.Subject, JTI: c.ID,
				Decision: bus.DecisionRevoked, Code: schemas.CodeSafetyDenied})
			gt.refused("revoked")
			return nil, tokenError("invalid token: it was revoked")
		}
		infoMu.Lock()
		defer infoMu.Unlock()
		info := infos[token]
		if info == nil {
			info = &sdkauth.TokenInfo{
				Scopes:     c.Scopes(),
				Expiration: c.ExpiresAt.Time,
				UserID:     c.Tenant + "/" + c.Subject,
				Extra:      map[string]any{claimsKey: c},
			}
			if len(infos) >= maxTokenInfos { // tokens the verifier has let go of are among them
				clear(infos)
			}
			infos[token] = info
		}
		return info, nil
	}
	middleware := func(base string) http.Handler {
		h := sdkauth.RequireBearerToken(verify, &sdkauth.RequireBearerTokenOptions{
			ResourceMetadataURL: base + "/.well-known/oauth-protected-resource/mcp",
		})(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !gt.passes(r) {
				if scheme, _, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); !strings.EqualFold(scheme, "bearer") {
					gt.refused("missing") // the others are counted where they are verified
				}
				// The refusal is written without reading the body, and the
				// connection closed after it: net/http would otherwise
				// read what the body declares before answering, and a
				// client that never sends it would hold the connection.
				w.Header().Set("Connection", "close")
			}
			h.ServeHTTP(w, r)
		})
	}
	if gt.publicURL != "" {
		return middleware(gt.baseURL(nil))
	}
	type origin struct {
		host string
		tls  bool
	}
	var (
		mu     sync.Mutex
		byHost = map[origin]http.Handler{}
	)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := origin{r.Host, r.TLS != nil}
		mu.Lock()
		h := byHost[o]
		mu.Unlock()
		if h == nil {
			h = middleware(gt.baseURL(r))
			mu.Lock()
			if len(byHost) < maxMetadataHosts {
				byHost[o] = h
			}
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// passes reports whether the request's bearer token will be accepted,
// as cheaply as possible for a token seen before.
func (gt *gate) passes(r *http.Request) bool {
	// Read as the SDK reads it: a scheme, any case, and a token.
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return false
	}
	token = strings.TrimSpace(token)
	jti, ok := gt.verifier.Cached(token)
	if !ok {
		c, err := gt.verify(r.Context(), token, r)
		if err != nil {
			return false
		}
		jti = c.ID
	}
	return gt.revocations == nil || !gt.revocations.Revoked(jti)
}

// tokenError is why a bearer token was refused, the one sentence of the
// 401 answer; it is an sdkauth.ErrInvalidToken.
type tokenError string

func (e tokenError) Error() string        { return string(e) }
func (e tokenError) Is(target error) bool { return target == sdkauth.ErrInvalidToken }

// maxTokenInfos bounds the TokenInfos kept (the verifier's cache of
// verified tokens has the same bound); maxMetadataHosts, the host names
// whose middleware is kept (clients name a few; any beyond get theirs
// built per request).
const (
	maxTokenInfos    = 4096
	maxMetadataHosts = 16
)

const claimsKey = "okso.claims"

func (gt *gate) revoked(c *auth.Claims) bool {
	return gt.revocations != nil && gt.revocations.Revoked(c.ID)
}

func claimsOf(ti *sdkauth.TokenInfo) *auth.Claims {
	if ti == nil {
		return nil
	}
	c, _ := ti.Extra[claimsKey].(*auth.Claims)
	return c
}

// verify verifies an agent's bearer token at /mcp: one of the
// authorization server's (by its key id), else okso's own.
func (gt *gate) verify(ctx context.Context, token string, r *http.Request) (*auth.Claims, error) {
	if gt.oauth != nil && gt.oauth.Issued(token) {
		return gt.oauth.Verify(ctx, token, gt.baseURL(r))
	}
	return gt.verifier.Verify(token)
}

// authorizationServers are those the protected-resource metadata lists:
// the trusted external issuers (Options.AuthorizationServers), then this
// gateway itself when it is one. Clients take the first: an operator who
// names an identity provider of their own prefers it.
func (gt *gate) authorizationServers(base string) []string {
	servers := append([]string{}, gt.servers...)
	if gt.oauth != nil {
		servers = append(servers, base)
	}
	return servers
}
