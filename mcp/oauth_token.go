package mcp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/okso-io/okso/bus"
)

// OAuthGrant is a grant: what the operator approved for a client, and
// its refresh-token family. A refresh token is <grant>.<generation>.<random>;
// the grant keeps only its current generation and that token's hash, so
// any token of the family with a lower generation, or the current one's
// with another secret, is a reuse and revokes the grant, however many
// rotations ago it was spent.
type OAuthGrant struct {
	ID        string    `json:"grant_id"`
	ClientID  string    `json:"client_id"`
	Tenant    string    `json:"tenant"`
	Scope     string    `json:"scope"`
	Resource  string    `json:"resource"`
	Issuer    string    `json:"issuer"`
	Created   time.Time `json:"created"`
	Refreshed time.Time `json:"refreshed"`
	Refresh   string    `json:"refresh"`          // the live refresh token's hash
	Gen       uint64    `json:"gen,omitempty"`    // the live refresh token's generation (0: a <grant>.<random> token)
	Access    []Issued  `json:"access,omitempty"` // access tokens not yet expired, for okso oauth revoke
}

// Issued is an access token of a grant: its id and expiry.
type Issued struct {
	JTI     string    `json:"jti"`
	Expires time.Time `json:"exp"`
}

// maxTokenForm bounds the token endpoint's body.
const maxTokenForm = 16 << 10

// pkceVerifierRe is a code verifier (RFC 7636 §4.1).
var pkceVerifierRe = regexp.MustCompile(`^[A-Za-z0-9._~-]{43,128}$`)

// tokenResponse is the token endpoint's answer (RFC 6749 §5.1).
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	RefreshToken string `json:"refresh_token"`
	Scope        string `json:"scope"`
}

func (s *OAuthServer) serveToken(w http.ResponseWriter, r *http.Request, base string) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		oauthError(w, http.StatusMethodNotAllowed, oauthInvalidRequest, "use POST")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		oauthError(w, http.StatusBadRequest, oauthInvalidRequest, "send the parameters as application/x-www-form-urlencoded")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxTokenForm)
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, oauthInvalidRequest, "the form is malformed or larger than 16 KiB")
		return
	}
	f := r.PostForm
	ctx := r.Context()
	clientID := f.Get("client_id")
	if clientID == "" {
		oauthError(w, http.StatusUnauthorized, oauthInvalidClient, "client_id is required (public clients, token_endpoint_auth_method none)")
		return
	}
	c, err := s.client(ctx, clientID)
	if errors.Is(err, errUnknownClient) {
		s.log.Info("oauth: token request of an unknown client", "client_id", clientID, "err", err)
		oauthError(w, http.StatusUnauthorized, oauthInvalidClient, unknownClientDesc)
		return
	}
	if errors.Is(err, errCIMDBusy) {
		w.Header().Set("Retry-After", "60")
		oauthError(w, http.StatusServiceUnavailable, oauthTemporarilyDown, "too many clients at once; try again in a minute")
		return
	}
	if err != nil {
		s.log.Error("oauth: find client", "err", err)
		oauthError(w, http.StatusServiceUnavailable, oauthTemporarilyDown, "the client registry is unavailable; try again")
		return
	}
	var (
		resp *tokenResponse
		te   *grantError
	)
	switch f.Get("grant_type") {
	case "authorization_code":
		resp, te = s.redeemCode(ctx, c, f.Get("code"), f.Get("redirect_uri"), f.Get("code_verifier"), f.Get("resource"), base)
	case "refresh_token":
		resp, te = s.refresh(ctx, c, f.Get("refresh_token"), f.Get("resource"), f.Get("scope"), base)
	case "":
		te = &grantError{oauthInvalidRequest, "grant_type is required"}
	default:
		te = &grantError{oauthUnsupportedGrantType, "grant_type must be authorization_code or refresh_token"}
	}
	if te != nil {
		status := http.StatusBadRequest
		switch te.code {
		case oauthInvalidClient:
			status = http.StatusUnauthorized
		case oauthTemporarilyDown, oauthServerError:
			status = http.StatusServiceUnavailable
		}
		oauthError(w, status, te.code, te.desc)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Pragma", "no-cache")
	writeJSON(w, http.StatusOK, resp)
}

// grantError is an OAuth error of the token endpoint.
type grantError struct{ code, desc string }

var errUnavailable = &grantError{oauthTemporarilyDown, "the authorization server's state is unavailable; try again"}

// redeemCode exchanges an authorization code for tokens, once across
// replicas: a second redemption of one code fails and revokes the grant
// the first made (RFC 6749 §4.1.2).
func (s *OAuthServer) redeemCode(ctx context.Context, c *oauthClient, code, redirect, verifier, resource, base string) (*tokenResponse, *grantError) {
	switch {
	case code == "":
		return nil, &grantError{oauthInvalidRequest, "code is required"}
	case verifier == "":
		return nil, &grantError{oauthInvalidRequest, "code_verifier is required (PKCE)"}
	case !pkceVerifierRe.MatchString(verifier):
		return nil, &grantError{oauthInvalidRequest, "code_verifier must be 43 to 128 unreserved characters (RFC 7636)"}
	case resource == "":
		return nil, &grantError{oauthInvalidRequest, "resource is required (RFC 8707): " + resourceOf(base)}
	}
	h := hashToken(code)
	b, _, err := s.o.Store.Get(ctx, bus.OAuthCode, h)
	if errors.Is(err, bus.ErrOAuthNotFound) {
		return nil, &grantError{oauthInvalidGrant, "the code is unknown or expired"}
	}
	if err != nil {
		s.log.Error("oauth: read code", "err", err)
		return nil, errUnavailable
	}
	var rec codeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, &grantError{oauthInvalidGrant, "the code is unknown or expired"}
	}
	sum := sha256.Sum256([]byte(verifier))
	switch {
	case rec.ClientID != c.ID:
		return nil, &grantError{oauthInvalidGrant, "the code was issued to another client"}
	case rec.RedirectURI != redirect:
		return nil, &grantError{oauthInvalidGrant, "redirect_uri is not the authorization request's"}
	case subtle.ConstantTimeCompare([]byte(base64.RawURLEncoding.EncodeToString(sum[:])), []byte(rec.Challenge)) != 1:
		return nil, &grantError{oauthInvalidGrant, "code_verifier does not match the code_challenge (S256)"}
	case strings.TrimSuffix(resource, "/") != rec.Resource:
		return nil, &grantError{oauthInvalidTarget, "resource is not the authorization request's"}
	case rec.Issuer != base:
		return nil, &grantError{oauthInvalidGrant, "the code was issued at another address of this server"}
	case !s.o.Now().Before(rec.Expires):
		return nil, &grantError{oauthInvalidGrant, "the code is unknown or expired"}
	}
	if _, err := s.o.Store.Create(ctx, bus.OAuthRedeemed, h, []byte(rec.GrantID), 2*s.o.CodeTTL); err != nil {
		if !errors.Is(err, bus.ErrOAuthExists) {
			s.log.Error("oauth: redeem code", "err", err)
			return nil, errUnavailable
		}
		s.log.Warn("oauth code replayed: its grant is revoked", "client_id", c.ID, "grant", rec.GrantID)
		s.audit(bus.DecisionRevoked, auditReplayed, rec.Tenant, c.ID, rec.GrantID, "")
		_ = s.revokeGrant(ctx, rec.GrantID)
		return nil, &grantError{oauthInvalidGrant, "the code was used already; the grant it made is revoked"}
	}
	now := s.o.Now().UTC()
	g := &OAuthGrant{
		ID: rec.GrantID, ClientID: c.ID, Tenant: rec.Tenant, Scope: rec.Scope, Resource: rec.Resource,
		Issuer: base, Created: now, Refreshed: now,
	}
	resp, err := s.issue(g, base)
	if err != nil {
		s.log.Error("oauth: mint", "err", err)
		return nil, &grantError{oauthServerError, "the authorization server could not sign the token"}
	}
	gb, _ := json.Marshal(g)
	if _, err := s.o.Store.Create(ctx, bus.OAuthGrant, g.ID, gb, s.o.RefreshTTL); err != nil {
		s.log.Error("oauth: keep grant", "err", err)
		return nil, errUnavailable
	}
	if !c.Document && c.Granted.IsZero() {
		s.keepClient(ctx, c.ID)
	}
	s.log.Info("oauth grant issued", "client_id", c.ID, "grant", g.ID, "tenant", g.Tenant, "scope", g.Scope)
	s.audit(bus.DecisionAllowed, auditGrant, g.Tenant, c.ID, g.ID, g.Access[len(g.Access)-1].JTI)
	return resp, nil
}

// issue mints an access token and a new refresh token for g, which it
// updates (the refresh token's hash, the access token's id).
func (s *OAuthServer) issue(g *OAuthGrant, base string) (*tokenResponse, error) {
	access, jti, exp, err := s.mint(g, base)
	if err != nil {
		return nil, err
	}
	now := s.o.Now()
	g.Access = slices.DeleteFunc(g.Access, func(a Issued) bool { return !now.Before(a.Expires) })
	g.Access = append(g.Access, Issued{JTI: jti, Expires: exp.UTC()})
	g.Gen++
	refresh := g.ID + "." + strconv.FormatUint(g.Gen, 10) + "." + randomToken()
	g.Refresh = hashToken(refresh)
	return &tokenResponse{
		AccessToken: access, TokenType: "Bearer", ExpiresIn: int(s.o.AccessTTL / time.Second),
		RefreshToken: refresh, Scope: g.Scope,
	}, nil
}

// refresh rotates a refresh token: the old one is spent, and presented
// again it revokes the whole grant (RFC 9700 §4.14.2). Two replicas
// rotating one token at once cannot both win: the grant is updated only
// if unchanged since read, and the loser sees its token spent.
func (s *OAuthServer) refresh(ctx context.Context, c *oauthClient, token, resource, scope, base string) (*tokenResponse, *grantError) {
	if token == "" {
		return nil, &grantError{oauthInvalidRequest, "refresh_token is required"}
	}
	gid, gen, ok := parseRefresh(token)
	if !ok {
		return nil, &grantError{oauthInvalidGrant, "the refresh token is unknown"}
	}
	h := hashToken(token)
	for range 3 {
		b, rev, err := s.o.Store.Get(ctx, bus.OAuthGrant, gid)
		if errors.Is(err, bus.ErrOAuthNotFound) {
			return nil, &grantError{oauthInvalidGrant, "the grant was revoked or expired; sign in again"}
		}
		if err != nil {
			s.log.Error("oauth: read grant", "err", err)
			return nil, errUnavailable
		}
		var g OAuthGrant
		if err := json.Unmarshal(b, &g); err != nil {
			return nil, &grantError{oauthInvalidGrant, "the refresh token is unknown"}
		}
		switch {
		case g.ClientID != c.ID:
			return nil, &grantError{oauthInvalidGrant, "the refresh token was issued to another client"}
		case resource != "" && strings.TrimSuffix(resource, "/") != g.Resource:
			return nil, &grantError{oauthInvalidTarget, "resource is not the grant's"}
		case g.Issuer != base:
			return nil, &grantError{oauthInvalidGrant, "the grant was made at another address of this server"}
		case gen > g.Gen:
			return nil, &grantError{oauthInvalidGrant, "the refresh token is unknown"}
		case gen < g.Gen || subtle.ConstantTimeCompare([]byte(h), []byte(g.Refresh)) != 1:
			s.log.Warn("oauth refresh token reused: its grant is revoked", "client_id", c.ID, "grant", g.ID)
			s.audit(bus.DecisionRevoked, auditReused, g.Tenant, c.ID, g.ID, "")
			_ = s.revokeGrant(ctx, g.ID)
			return nil, &grantError{oauthInvalidGrant, "the refresh token was used already; its grant is revoked: sign in again"}
		}
		for _, sc := range strings.Fields(scope) {
			if !slices.Contains(strings.Fields(g.Scope), sc) {
				return nil, &grantError{oauthInvalidScope, fmt.Sprintf("scope %q was not granted", sc)}
			}
		}
		g.Refreshed = s.o.Now().UTC()
		resp, err := s.issue(&g, base)
		if err != nil {
			s.log.Error("oauth: mint", "err", err)
			return nil, &grantError{oauthServerError, "the authorization server could not sign the token"}
		}
		gb, _ := json.Marshal(&g)
		_, err = s.o.Store.Update(ctx, bus.OAuthGrant, g.ID, gb, rev, s.o.RefreshTTL)
		if errors.Is(err, bus.ErrOAuthChanged) {
			continue // read again: the token is now spent, or the grant gone
		}
		if err != nil {
			s.log.Error("oauth: rotate", "err", err)
			return nil, errUnavailable
		}
		s.audit(bus.DecisionAllowed, auditRefresh, g.Tenant, c.ID, g.ID, g.Access[len(g.Access)-1].JTI)
		return resp, nil
	}
	return nil, errUnavailable
}

// parseRefresh splits a refresh token into its grant id and generation:
// <grant>.<gen>.<random>, or <grant>.<random> (generation 0, as the
// first tokens were made).
func parseRefresh(token string) (grant string, gen uint64, ok bool) {
	parts := strings.Split(token, ".")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return parts[0], 0, true
	case len(parts) == 3 && parts[0] != "" && parts[2] != "":
		gen, err := strconv.ParseUint(parts[1], 10, 64)
		if err != nil || gen == 0 {
			return "", 0, false
		}
		return parts[0], gen, true
	}
	return "", 0, false
}

// revokeGrant deletes a grant here, where the gateway may not write the
// revocations: its access tokens are refused within grantRecheck at
// every replica (at once at this one), its refresh tokens at once.
func (s *OAuthServer) revokeGrant(ctx context.Context, grant string) error {
	s.forget(grant)
	return s.o.Store.Delete(ctx, bus.OAuthGrant, grant)
}

// RevokeOAuthGrant revokes a grant (okso oauth revoke): its access
// tokens' ids are written to the revocations, when revs is set (the
// admin's), and the grant is deleted, so its refresh tokens fail.
func RevokeOAuthGrant(ctx context.Context, st *bus.OAuthStore, revs *bus.Revocations, grant string) (*OAuthGrant, error) {
	b, _, err := st.Get(ctx, bus.OAuthGrant, grant)
	if err != nil {
		return nil, err
	}
	var g OAuthGrant
	if err := json.Unmarshal(b, &g); err != nil {
		return nil, fmt.Errorf("oauth grant %s: %w", grant, err)
	}
	if revs != nil {
		for _, a := range g.Access {
			if time.Now().Before(a.Expires) {
				if err := revs.Revoke(ctx, a.JTI, a.Expires); err != nil {
					return nil, err
				}
			}
		}
	}
	return &g, st.Delete(ctx, bus.OAuthGrant, grant)
}

// OAuthGrants lists the live grants, by grant id.
func OAuthGrants(ctx context.Context, st *bus.OAuthStore) (map[string]*OAuthGrant, error) {
	all, err := st.List(ctx, bus.OAuthGrant)
	if err != nil {
		return nil, err
	}
	out := map[string]*OAuthGrant{}
	for id, b := range all {
		var g OAuthGrant
		if json.Unmarshal(b, &g) == nil {
			out[id] = &g
		}
	}
	return out, nil
}
