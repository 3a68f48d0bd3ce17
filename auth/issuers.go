package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// OAuthServerName is the name okso's own authorization server (package
// mcp) puts before its subjects, oauth:<client_id>:<grant_id>: no
// external issuer may take it, or its users' subjects could be a grant's.
const OAuthServerName = "oauth"

// IssuerConfig is one trusted external issuer of agent tokens: the user's
// identity provider (Keycloak, Entra ID, Okta, ...), whose access tokens
// the gateway accepts beside okso's own.
type IssuerConfig struct {
	// Name is okso's name for the issuer. A subject it vouches for is
	// Name:sub, so the users of two issuers never share a subject.
	Name string
	// Issuer is its URL: the iss of its tokens, and where its discovery
	// document is (Issuer/.well-known/openid-configuration).
	Issuer string
	// Audience is what its tokens for okso carry in aud (Entra and Okta
	// use api://..., not the gateway's URL).
	Audience string
	// Tenant, when set, is the tenant of every token of this issuer.
	// Otherwise the claim TenantClaim holds it, and only the tenants in
	// Tenants are accepted: an issuer trusted for one tenant cannot speak
	// for another.
	Tenant      string
	TenantClaim string
	Tenants     []string
	// ScopeClaim names the claim holding the scopes, "scope" or "scp"
	// (a string of space-separated scopes or a list); "" reads scope, or
	// scp when there is no scope.
	ScopeClaim string
	// Scopes renames the issuer's scopes to okso's. When it is set, only
	// the scopes it names are granted; when nil, the issuer's scopes count
	// under their own names. Either way only okso's call scopes grant
	// anything.
	Scopes map[string]string
}

// IssuersOptions tune [NewIssuers]; the zero value means the defaults.
type IssuersOptions struct {
	// Timeout bounds discovery and each fetch of a key set (10 s).
	Timeout time.Duration
	// Refresh is how often each key set is fetched again, so a key the
	// issuer withdrew stops being accepted (1 h).
	Refresh time.Duration
	// Logger gets the key set refreshes that fail (slog.Default()).
	Logger *slog.Logger
	// Transport makes the requests to the issuers (http.DefaultTransport).
	Transport http.RoundTripper
}

// refetchEvery is the least time between two fetches of an issuer's key
// set caused by tokens with a key id it did not have: a key rotation is
// picked up at once, but a flood of made-up key ids costs the issuer one
// request a minute.
const refetchEvery = time.Minute

// ExternalAlgorithms are the signing algorithms accepted from external
// issuers. "none" and HMAC are never accepted: an HMAC key would be the
// issuer's public key, which anyone has.
var externalAlgorithms = []string{"RS256", "ES256", "EdDSA"}

// Issuers verifies the tokens of trusted external issuers. It is safe for
// concurrent use; the zero value trusts nobody. Make it with [NewIssuers].
type Issuers struct {
	byIss map[string]*issuer
	urls  []string // in the configured order
	stop  context.CancelFunc
}

// issuer is one trusted issuer, discovered and with its key set loaded.
type issuer struct {
	cfg    IssuerConfig
	keys   keyfunc.Keyfunc
	parser *jwt.Parser
}

// NewIssuers discovers each issuer (its OpenID configuration) and fetches
// its key set, and fails when any of that fails: a gateway that started
// with an issuer it cannot reach would refuse all its users with no sign
// of why but in its log. ctx bounds that start; the key sets are then
// refreshed in the background until [Issuers.Close].
//
// Issuer and key set URLs must be https, or http on a loopback address
// (traffic that never leaves the host, such as a local test provider).
func NewIssuers(ctx context.Context, cfgs []IssuerConfig, o IssuersOptions) (*Issuers, error) {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Refresh <= 0 {
		o.Refresh = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	client := &http.Client{
		Transport: o.Transport,
		Timeout:   o.Timeout,
		CheckRedirect: func(r *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			return fetchable(r.URL)
		},
	}
	// The key sets outlive ctx, which only bounds the start: their
	// refreshes (and the refetches of unknown key ids) run under bg.
	bg, stop := context.WithCancel(context.Background())
	defer context.AfterFunc(ctx, stop)()
	is := &Issuers{byIss: map[string]*issuer{}, stop: stop}
	ok := false
	defer func() {
		if !ok {
			stop()
		}
	}()
	for _, c := range cfgs {
		if c.Name == OAuthServerName {
			return nil, fmt.Errorf("issuer %s: the name is okso's own authorization server's", c.Name)
		}
		if c.Issuer == Issuer {
			return nil, fmt.Errorf("issuer %s: %q is okso's own issuer", c.Name, c.Issuer)
		}
		if _, dup := is.byIss[c.Issuer]; dup {
			return nil, fmt.Errorf("issuer %s: %s is listed twice", c.Name, c.Issuer)
		}
		jwksURL, err := discover(ctx, client, c.Issuer)
		if err != nil {
			return nil, fmt.Errorf("issuer %s: %w", c.Name, err)
		}
		log := o.Logger.With("issuer", c.Name)
		store, err := jwkset.NewStorageFromHTTP(jwksURL, jwkset.HTTPClientStorageOptions{
			Client:          client,
			Ctx:             bg,
			HTTPTimeout:     o.Timeout,
			RefreshInterval: o.Refresh,
			RefreshErrorHandler: func(_ context.Context, err error) {
				log.Warn("fetch the issuer's key set", "url", jwksURL, "err", err)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("issuer %s: fetch its key set %s: %w", c.Name, jwksURL, err)
		}
		keys, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
			HTTPURLs: map[string]jwkset.Storage{jwksURL: store},
			// A token with an unknown kid waits for the limiter only
			// when its turn comes within this time; otherwise it is
			// refused at once. The fetch itself must fit in it too.
			RateLimitWaitMax:  o.Timeout,
			RefreshUnknownKID: rate.NewLimiter(rate.Every(refetchEvery), 1),
		})
		if err != nil {
			return nil, fmt.Errorf("issuer %s: %w", c.Name, err)
		}
		// Keys meant for encryption are not signing keys; keys that
		// do not say what they are for count as signing keys.
		kf, err := keyfunc.New(keyfunc.Options{Ctx: bg, Storage: keys, UseWhitelist: []jwkset.USE{jwkset.UseSig, ""}})
		if err != nil {
			return nil, fmt.Errorf("issuer %s: %w", c.Name, err)
		}
		is.byIss[c.Issuer] = &issuer{
			cfg:  c,
			keys: kf,
			parser: jwt.NewParser(
				jwt.WithValidMethods(externalAlgorithms),
				jwt.WithIssuer(c.Issuer),
				jwt.WithAudience(c.Audience),
				jwt.WithExpirationRequired(),
				jwt.WithIssuedAt(),
				jwt.WithLeeway(leeway),
			),
		}
		is.urls = append(is.urls, c.Issuer)
	}
	ok = true
	return is, nil
}

// Close stops refreshing the key sets; tokens with a key id not fetched
// yet are refused from then on. A nil *Issuers may be closed.
func (is *Issuers) Close() {
	if is != nil && is.stop != nil {
		is.stop()
	}
}

// URLs returns the trusted issuers' URLs, in the configured order: the
// authorization servers of the protected-resource metadata.
func (is *Issuers) URLs() []string {
	if is == nil {
		return nil
	}
	return slices.Clone(is.urls)
}

// Trusts reports whether iss is a trusted issuer's URL.
func (is *Issuers) Trusts(iss string) bool {
	if is == nil {
		return false
	}
	_, ok := is.byIss[iss]
	return ok
}

// Verify checks a token of the trusted issuer it names in iss and returns
// okso's claims for it. Every failure wraps [ErrInvalid].
func (is *Issuers) Verify(token string) (*Claims, error) {
	iss := peekIssuer(token)
	var i *issuer
	if is != nil {
		i = is.byIss[iss]
	}
	if i == nil {
		return nil, fmt.Errorf("%w: its issuer is not one this server trusts", ErrInvalid)
	}
	return i.verify(token)
}

// maxDiscovery bounds an issuer's discovery document.
const maxDiscovery = 1 << 20

// discover reads an issuer's OpenID configuration and returns its key
// set's URL. The document must name the issuer exactly as configured
// (OpenID Connect Discovery §4.3): otherwise its tokens would not carry
// the iss okso checks.
func discover(ctx context.Context, client *http.Client, iss string) (string, error) {
	u, err := url.Parse(iss)
	if err != nil {
		return "", fmt.Errorf("issuer URL: %w", err)
	}
	if err := fetchable(u); err != nil {
		return "", fmt.Errorf("issuer URL: %w", err)
	}
	where := strings.TrimSuffix(iss, "/") + "/.well-known/openid-configuration"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("discovery: GET %s: %s", where, resp.Status)
	}
	var doc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxDiscovery)).Decode(&doc); err != nil {
		return "", fmt.Errorf("discovery: %s: %w", where, err)
	}
	if doc.Issuer != iss {
		return "", fmt.Errorf("discovery: %s names the issuer %q, not %q: configure the issuer exactly as it names itself", where, doc.Issuer, iss)
	}
	ju, err := url.Parse(doc.JWKSURI)
	if err != nil || doc.JWKSURI == "" {
		return "", fmt.Errorf("discovery: %s has no valid jwks_uri", where)
	}
	if err := fetchable(ju); err != nil {
		return "", fmt.Errorf("discovery: jwks_uri: %w", err)
	}
	return doc.JWKSURI, nil
}

// FetchableURL reports why okso would not fetch an issuer's discovery
// document or keys from s (nil: it would).
func FetchableURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	return fetchable(u)
}

// fetchable refuses URLs okso must not fetch keys from: anything but
// https, except http to a loopback address, where nothing on the way can
// change the keys.
func fetchable(u *url.URL) error {
	switch {
	case u.Scheme == "https" && u.Host != "":
		return nil
	case u.Scheme == "http" && IsLoopback(u.Hostname()):
		return nil
	}
	return fmt.Errorf("%s: not https (plain http is allowed only to a loopback address)", u.Redacted())
}

// IsLoopback reports whether host (a name or an address, without port)
// is a loopback address: localhost, 127.0.0.0/8 or ::1.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// peekIssuer returns the iss claim of a token without checking anything,
// to choose who checks it; "" if there is none.
func peekIssuer(token string) string {
	_, rest, ok := strings.Cut(token, ".")
	if !ok {
		return ""
	}
	payload, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	var c struct {
		Iss string `json:"iss"`
	}
	b, err := jwt.NewParser().DecodeSegment(payload)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return ""
	}
	return c.Iss
}

// maxSubject bounds the sub claim of an external token, which okso logs
// and audits.
const maxSubject = 255

// verify checks one of the issuer's tokens and maps its claims to okso's.
func (i *issuer) verify(token string) (*Claims, error) {
	mc := jwt.MapClaims{}
	t, err := i.parser.ParseWithClaims(token, mc, i.keys.Keyfunc)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, i.reason(err, t, mc))
	}
	var c Claims
	c.Issuer = i.cfg.Issuer
	c.Audience, _ = mc.GetAudience()
	c.ExpiresAt, _ = mc.GetExpirationTime()
	c.NotBefore, _ = mc.GetNotBefore()
	c.IssuedAt, _ = mc.GetIssuedAt()
	sub, _ := mc["sub"].(string)
	if sub == "" || len(sub) > maxSubject || !printable(sub) {
		return nil, fmt.Errorf("%w: its subject (sub) is missing, longer than %d bytes or not printable", ErrInvalid, maxSubject)
	}
	c.Subject = i.cfg.Name + ":" + sub
	if jti, ok := mc["jti"].(string); ok {
		c.ID = jti
	}
	c.Tenant = i.cfg.Tenant
	if c.Tenant == "" {
		v, _ := mc[i.cfg.TenantClaim].(string)
		if v == "" {
			return nil, fmt.Errorf("%w: it has no tenant claim %s (issuer %s)", ErrInvalid, i.cfg.TenantClaim, i.cfg.Name)
		}
		if !slices.Contains(i.cfg.Tenants, v) {
			// The value is not quoted: it is the sender's text.
			return nil, fmt.Errorf("%w: its tenant claim %s names a tenant outside the tenants issuer %s is trusted for",
				ErrInvalid, i.cfg.TenantClaim, i.cfg.Name)
		}
		c.Tenant = v
	}
	if !tenantRe.MatchString(c.Tenant) {
		return nil, fmt.Errorf("%w: its tenant is malformed", ErrInvalid)
	}
	c.Scope = strings.Join(i.scopes(mc), " ")
	return &c, nil
}

// scopes returns okso's call scopes among those the token grants, renamed
// as configured.
func (i *issuer) scopes(mc jwt.MapClaims) []string {
	raw := mc[i.cfg.ScopeClaim]
	if i.cfg.ScopeClaim == "" {
		var ok bool
		if raw, ok = mc["scope"]; !ok {
			raw = mc["scp"]
		}
	}
	var theirs []string
	switch v := raw.(type) {
	case string:
		theirs = strings.Split(v, " ")
	case []any: // Okta's scp
		for _, s := range v {
			if s, ok := s.(string); ok {
				theirs = append(theirs, s)
			}
		}
	}
	var ours []string
	for _, s := range theirs {
		if i.cfg.Scopes != nil {
			s = i.cfg.Scopes[s]
		}
		if callRank(s) > 0 && !slices.Contains(ours, s) {
			ours = append(ours, s)
		}
	}
	return ours
}

// reason words why the parser refused an external token, as
// [Verifier.reason] does for okso's own.
func (i *issuer) reason(err error, t *jwt.Token, mc jwt.MapClaims) string {
	var alg string
	if t != nil {
		alg, _ = t.Header["alg"].(string)
	}
	switch {
	case t == nil, errors.Is(err, jwt.ErrTokenMalformed):
		return "it is not a well-formed JWT"
	case !slices.Contains(externalAlgorithms, alg):
		return "its signing algorithm is not " + strings.Join(externalAlgorithms, ", ") + " (issuer " + i.cfg.Name + ")"
	case errors.Is(err, keyfunc.ErrKeyfunc), errors.Is(err, jwkset.ErrKeyNotFound):
		return "it was signed with a key issuer " + i.cfg.Name + " does not publish (its key set was fetched again " +
			"at most a minute ago)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "its signature does not verify with issuer " + i.cfg.Name + "'s key"
	case errors.Is(err, jwt.ErrTokenExpired):
		if exp, _ := mc.GetExpirationTime(); exp != nil {
			return "it expired at " + exp.UTC().Format(time.RFC3339) + "; get a new one from issuer " + i.cfg.Name
		}
		return "it expired"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing) && mc["exp"] == nil:
		return "it has no expiry (exp)"
	case errors.Is(err, jwt.ErrTokenNotValidYet), errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return "it is not valid yet (check the clocks)"
	case errors.Is(err, jwt.ErrTokenInvalidAudience), errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "it is not meant for this server (its audience is not " + i.cfg.Audience + ")"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "its issuer is not " + i.cfg.Issuer
	}
	return "it is not a well-formed JWT"
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// Trust verifies agent tokens of okso's own and of trusted external
// issuers, choosing by the token's iss. It is safe for concurrent use.
// Make it with [NewTrust].
type Trust struct {
	own     *Verifier
	issuers *Issuers
	cache   verified // external tokens' claims; okso's are in own's cache
}

// NewTrust returns a verifier of okso's tokens (own) and of the tokens of
// issuers (nil: none).
func NewTrust(own *Verifier, issuers *Issuers) *Trust {
	return &Trust{own: own, issuers: issuers}
}

// Verify checks a token and returns its claims: a token whose iss is a
// trusted issuer's goes to that issuer, any other to okso's verifier.
// Either is checked once and then kept until it expires, as
// [Verifier.Verify] does. Every failure wraps [ErrInvalid].
func (t *Trust) Verify(token string) (*Claims, error) {
	if len(token) > 8192 {
		return nil, fmt.Errorf("%w: it is longer than 8192 bytes", ErrInvalid)
	}
	if t.issuers == nil || len(t.issuers.byIss) == 0 {
		return t.own.Verify(token)
	}
	if c, ok := t.cache.get(token); ok {
		return c, nil
	}
	iss := peekIssuer(token)
	i := t.issuers.byIss[iss]
	if i == nil {
		c, err := t.own.Verify(token)
		if err != nil && iss != "" && iss != Issuer {
			return nil, fmt.Errorf("%w: its issuer is neither okso nor one of the trusted issuers", ErrInvalid)
		}
		return c, err
	}
	c, err := i.verify(token)
	if err != nil {
		return nil, err
	}
	t.cache.put(token, c)
	cc := *c
	return &cc, nil
}

// Cached reports whether token was verified and has not expired since,
// with its id (jti), as [Verifier.Cached].
func (t *Trust) Cached(token string) (jti string, ok bool) {
	if jti, ok := t.own.Cached(token); ok {
		return jti, true
	}
	return t.cache.jti(token)
}
