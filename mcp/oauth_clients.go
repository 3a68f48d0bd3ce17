package mcp

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/time/rate"

	"github.com/okso-io/okso/bus"
)

// oauthClient is what the server knows of a client: registered (RFC
// 7591, kept in okso_oauth) or described by its metadata document (its
// client id is the document's URL).
type oauthClient struct {
	ID           string    `json:"client_id"`
	Name         string    `json:"client_name,omitempty"`
	URI          string    `json:"client_uri,omitempty"`
	RedirectURIs []string  `json:"redirect_uris"`
	Registered   time.Time `json:"registered,omitzero"`
	// Granted is when a registered client was first granted: until then
	// it lives only unusedClientTTL, then ClientTTL.
	Granted  time.Time `json:"granted,omitzero"`
	Document bool      `json:"-"` // a Client ID Metadata Document's
}

// errUnknownClient: no registered client has the id, or its metadata
// document could not be had. errCIMDBusy: the document is not cached and
// this replica fetched too many lately. What wraps them may name
// internal addresses: log it, and tell the caller only
// [unknownClientDesc] or to try again.
var (
	errUnknownClient = errors.New("unknown client")
	errCIMDBusy      = errors.New("too many client metadata documents fetched at once")
)

// unknownClientDesc is all a caller learns of an unknown client: the
// reason (a fetch error, an address a name resolved to) goes to the log.
const unknownClientDesc = "unknown client: its registration expired or was revoked (register again), " +
	"or its metadata document could not be fetched or is invalid"

// maxRedirectURIs bounds a client's redirect URIs; maxClientName its
// name's length. unusedClientTTL is the life of a registered client
// never granted (a sign-in takes minutes): registrations nobody uses
// cannot hold the cap (MaxClients) for long.
const (
	maxRedirectURIs = 10
	maxClientName   = 100
	maxRegisterBody = 16 << 10
	unusedClientTTL = time.Hour
)

// client returns the client id names: a metadata document's when id is
// an https URL, else a registered one.
func (s *OAuthServer) client(ctx context.Context, id string) (*oauthClient, error) {
	if strings.HasPrefix(id, "https://") {
		c, err := s.cimd.fetch(ctx, id)
		if errors.Is(err, errCIMDBusy) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUnknownClient, err)
		}
		return c, nil
	}
	b, _, err := s.o.Store.Get(ctx, bus.OAuthClient, id)
	if errors.Is(err, bus.ErrOAuthNotFound) {
		return nil, fmt.Errorf("%w: %s is not registered (or its registration expired or was revoked): register again", errUnknownClient, id)
	}
	if err != nil {
		return nil, err
	}
	var c oauthClient
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("client %s: %w", id, err)
	}
	if !s.clientLive(&c) { // its key's TTL is about to take it
		return nil, fmt.Errorf("%w: %s was registered but never used, and expired: register again", errUnknownClient, id)
	}
	return &c, nil
}

// unusedTTL is the life of a registered client never granted.
func (s *OAuthServer) unusedTTL() time.Duration { return min(unusedClientTTL, s.o.ClientTTL) }

// clientLive reports whether a registered client counts: granted once,
// or registered within unusedTTL.
func (s *OAuthServer) clientLive(c *oauthClient) bool {
	return !c.Granted.IsZero() || s.o.Now().Sub(c.Registered) < s.unusedTTL()
}

// keepClient makes a registered client, granted for the first time, live
// ClientTTL rather than unusedTTL. When it cannot, the client expires
// early and its host registers again.
func (s *OAuthServer) keepClient(ctx context.Context, id string) {
	for range 3 {
		b, rev, err := s.o.Store.Get(ctx, bus.OAuthClient, id)
		if err != nil {
			s.log.Warn("oauth: keep client", "client_id", id, "err", err)
			return
		}
		var c oauthClient
		if err := json.Unmarshal(b, &c); err != nil || !c.Granted.IsZero() {
			return
		}
		c.Granted = s.o.Now().UTC().Truncate(time.Second)
		b, _ = json.Marshal(&c)
		_, err = s.o.Store.Update(ctx, bus.OAuthClient, id, b, rev, s.o.ClientTTL)
		if errors.Is(err, bus.ErrOAuthChanged) {
			continue
		}
		if err != nil {
			s.log.Warn("oauth: keep client", "client_id", id, "err", err)
		}
		return
	}
}

// serveRegister is RFC 7591 registration, for hosts that do not use
// metadata documents: public clients only (token_endpoint_auth_method
// none), capped in number and rate.
func (s *OAuthServer) serveRegister(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		oauthError(w, http.StatusMethodNotAllowed, oauthInvalidRequest, "register with POST")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		oauthError(w, http.StatusBadRequest, oauthInvalidClientMeta, "send the client metadata as application/json")
		return
	}
	if !s.register.Allow() {
		w.Header().Set("Retry-After", "60")
		oauthError(w, http.StatusTooManyRequests, oauthTemporarilyDown, "too many client registrations at once; try again in a minute")
		return
	}
	var meta oauthex.ClientRegistrationMetadata
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRegisterBody))
	if err := dec.Decode(&meta); err != nil {
		oauthError(w, http.StatusBadRequest, oauthInvalidClientMeta, "the client metadata is not JSON of at most 16 KiB: "+err.Error())
		return
	}
	c, code, err := checkClientMetadata(&meta)
	if err != nil {
		oauthError(w, http.StatusBadRequest, code, err.Error())
		return
	}
	ctx := r.Context()
	all, err := s.o.Store.List(ctx, bus.OAuthClient)
	if err != nil {
		s.log.Error("oauth: count clients", "err", err)
		oauthError(w, http.StatusServiceUnavailable, oauthTemporarilyDown, "the client registry is unavailable; try again")
		return
	}
	live := 0
	for _, b := range all {
		var c oauthClient
		if json.Unmarshal(b, &c) == nil && s.clientLive(&c) {
			live++
		}
	}
	if live >= s.o.MaxClients {
		oauthError(w, http.StatusForbidden, oauthAccessDenied, fmt.Sprintf(
			"this okso has %d registered clients, its cap; its operator may remove some (okso oauth revoke --client ID)", live))
		return
	}
	c.ID = "c" + strings.ToLower(rand.Text())
	c.Registered = s.o.Now().UTC().Truncate(time.Second)
	b, _ := json.Marshal(c)
	if _, err := s.o.Store.Create(ctx, bus.OAuthClient, c.ID, b, s.unusedTTL()); err != nil {
		s.log.Error("oauth: register client", "err", err)
		oauthError(w, http.StatusServiceUnavailable, oauthTemporarilyDown, "the client registry is unavailable; try again")
		return
	}
	s.log.Info("oauth client registered", "client_id", c.ID, "client_name", c.Name)
	meta.TokenEndpointAuthMethod = "none"
	meta.GrantTypes = []string{"authorization_code", "refresh_token"}
	meta.ResponseTypes = []string{"code"}
	meta.RedirectURIs = c.RedirectURIs
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, &oauthex.ClientRegistrationResponse{
		ClientRegistrationMetadata: meta,
		ClientID:                   c.ID,
		ClientIDIssuedAt:           c.Registered,
	})
}

// checkClientMetadata checks what a client says of itself, registering
// or in its metadata document, and returns what okso keeps of it; on
// refusal, the RFC 7591 error code.
func checkClientMetadata(m *oauthex.ClientRegistrationMetadata) (*oauthClient, string, error) {
	if len(m.RedirectURIs) == 0 || len(m.RedirectURIs) > maxRedirectURIs {
		return nil, oauthInvalidRedirectURI, fmt.Errorf("give 1 to %d redirect_uris", maxRedirectURIs)
	}
	for _, u := range m.RedirectURIs {
		if err := checkRedirectURI(u); err != nil {
			return nil, oauthInvalidRedirectURI, err
		}
	}
	if a := m.TokenEndpointAuthMethod; a != "" && a != "none" && a != "client_secret_post" && a != "client_secret_basic" {
		// The secret methods are answered with none (a public client);
		// key-based ones cannot be.
		return nil, oauthInvalidClientMeta, fmt.Errorf("token_endpoint_auth_method %q: this server has public clients only (none)", a)
	}
	for _, g := range m.GrantTypes {
		if g != "authorization_code" && g != "refresh_token" {
			return nil, oauthInvalidClientMeta, fmt.Errorf("grant type %q: only authorization_code and refresh_token", g)
		}
	}
	for _, rt := range m.ResponseTypes {
		if rt != "code" {
			return nil, oauthInvalidClientMeta, fmt.Errorf("response type %q: only code", rt)
		}
	}
	if len(m.ClientName) > maxClientName || strings.ContainsFunc(m.ClientName, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return nil, oauthInvalidClientMeta, fmt.Errorf("client_name: at most %d printable characters", maxClientName)
	}
	c := &oauthClient{Name: m.ClientName, RedirectURIs: slices.Clone(m.RedirectURIs)}
	if u, err := url.Parse(m.ClientURI); err == nil && u.Scheme == "https" && len(m.ClientURI) <= 256 {
		c.URI = m.ClientURI
	}
	return c, "", nil
}

// checkRedirectURI accepts https URLs, http ones on a loopback address
// (RFC 8252 §7.3) and private-use schemes (a reverse domain name, RFC
// 8252 §7.1); never a fragment.
func checkRedirectURI(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil || len(s) > 2048 || !u.IsAbs():
		return fmt.Errorf("redirect URI %q: not an absolute URL", s)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fmt.Errorf("redirect URI %q: has a fragment", s)
	case u.User != nil:
		return fmt.Errorf("redirect URI %q: has credentials", s)
	case u.Scheme == "https" && u.Host != "":
		return nil
	case u.Scheme == "http" && isLoopbackHost(u.Hostname()):
		return nil
	case u.Scheme != "http" && u.Scheme != "https" && strings.Contains(u.Scheme, ".") &&
		u.Scheme != "javascript" && u.Scheme != "data" && u.Scheme != "file":
		return nil
	}
	return fmt.Errorf("redirect URI %q: want https, http on a loopback address, or a private-use scheme", s)
}

// isLoopbackHost: an http redirect URI's host may be a loopback literal
// or localhost.
func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsLoopback()
}

// redirectMatches reports whether the redirect URI of an authorization
// request is one the client registered: exactly, except that an http
// redirect on a loopback IP literal may have any port (RFC 8252 §7.3:
// a native app's port is chosen when it runs).
func redirectMatches(registered []string, got string) bool {
	if slices.Contains(registered, got) {
		return true
	}
	g, err := url.Parse(got)
	if err != nil || g.Scheme != "http" || !loopbackLiteral(g.Hostname()) {
		return false
	}
	for _, r := range registered {
		u, err := url.Parse(r)
		if err != nil || u.Scheme != "http" || !loopbackLiteral(u.Hostname()) {
			continue
		}
		if u.Hostname() == g.Hostname() && u.EscapedPath() == g.EscapedPath() && u.RawQuery == g.RawQuery && g.User == nil {
			return true
		}
	}
	return false
}

// loopbackLiteral: 127.0.0.1 or [::1], the addresses RFC 8252 lets a
// native app pick the port of.
func loopbackLiteral(h string) bool { return h == "127.0.0.1" || h == "::1" }

// CIMDOptions configure how client metadata documents are fetched. The
// zero value is the safe default: https only, no redirects, 5 KB, 5 s,
// no private, loopback or link-local address.
type CIMDOptions struct {
	// AllowLoopback admits 127.0.0.1 (and only it): for tests, whose
	// documents are served there.
	AllowLoopback bool
	// TLS, when set, is the client's TLS configuration (tests trust their
	// server's certificate with it).
	TLS *tls.Config
}

// maxCIMD bounds a metadata document; cimdTimeout its fetch; cimdCache
// how long a fetched document is used, and cimdCacheSize how many are
// kept; cimdRate and cimdBurst the fetches a replica makes (the cache
// spares them), from the authorize page and the token endpoint alike:
// anyone may name a URL there.
const (
	maxCIMD       = 5 << 10
	cimdTimeout   = 5 * time.Second
	cimdCache     = 5 * time.Minute
	cimdCacheSize = 256
	cimdRate      = 5
	cimdBurst     = 100
)

// cimdFetcher fetches Client ID Metadata Documents, safely against a
// client id that points at the gateway's own network (SSRF): the check
// is made on the address dialled, after resolution, so a name that
// resolves to a private address is refused too.
type cimdFetcher struct {
	client *http.Client
	limit  *rate.Limiter // on the server's clock
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cimdEntry
}

type cimdEntry struct {
	c  *oauthClient
	at time.Time
}

func newCIMDFetcher(o CIMDOptions, now func() time.Time) *cimdFetcher {
	d := &net.Dialer{
		Timeout: cimdTimeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("client metadata: dial %s: %w", address, err)
			}
			if !publicAddr(ap.Addr().Unmap(), o.AllowLoopback) {
				return fmt.Errorf("client metadata: %s is not a public address", ap.Addr())
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy:                  nil, // the address checked is the one dialled
		DialContext:            d.DialContext,
		TLSClientConfig:        o.TLS,
		TLSHandshakeTimeout:    cimdTimeout,
		ResponseHeaderTimeout:  cimdTimeout,
		MaxResponseHeaderBytes: 16 << 10,
		DisableKeepAlives:      true,
	}
	return &cimdFetcher{
		client: &http.Client{
			Transport: tr,
			Timeout:   cimdTimeout,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return errors.New("client metadata: redirects are refused")
			},
		},
		limit: rate.NewLimiter(cimdRate, cimdBurst),
		now:   now,
		cache: map[string]cimdEntry{},
	}
}

// publicAddr reports whether a may be dialled for a metadata document.
// An IPv6 address that carries an IPv4 one is judged by it where the
// embedding is fixed (NAT64's well-known prefix, 6to4) and refused where
// it is not or is obsolete (local-use NAT64, Teredo, IPv4-compatible):
// through a translator they reach 10.0.0.5 or 169.254.169.254 too.
func publicAddr(a netip.Addr, allowLoopback bool) bool {
	a = a.Unmap()
	if allowLoopback && a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
		return true
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case netip.MustParsePrefix("64:ff9b::/96").Contains(a): // RFC 6052
			return publicAddr(netip.AddrFrom4([4]byte(b[12:16])), false)
		case netip.MustParsePrefix("2002::/16").Contains(a): // 6to4, RFC 3056
			return publicAddr(netip.AddrFrom4([4]byte(b[2:6])), false)
		case netip.MustParsePrefix("64:ff9b:1::/48").Contains(a), // RFC 8215
			netip.MustParsePrefix("2001::/32").Contains(a), // Teredo, RFC 4380
			netip.MustParsePrefix("::/96").Contains(a):     // IPv4-compatible, RFC 4291
			return false
		}
	}
	cgnat := netip.MustParsePrefix("100.64.0.0/10")
	return a.IsGlobalUnicast() && !a.IsPrivate() && !a.IsLoopback() && !a.IsLinkLocalUnicast() &&
		!cgnat.Contains(a) && !netip.MustParsePrefix("fc00::/7").Contains(a)
}

// checkCIMDURL: an https URL with a path, no fragment, no credentials,
// no dot segments (the draft's requirements on a client id).
func checkCIMDURL(id string) error {
	u, err := url.Parse(id)
	switch {
	case err != nil || len(id) > 2048:
		return errors.New("the client id is not a URL")
	case u.Scheme != "https" || u.Host == "":
		return errors.New("a client id URL must be https")
	case u.Path == "" || u.Path == "/":
		return errors.New("a client id URL must have a path")
	case u.Fragment != "" || strings.Contains(id, "#"), u.User != nil:
		return errors.New("a client id URL may have neither a fragment nor credentials")
	case slices.ContainsFunc(strings.Split(u.Path, "/"), func(s string) bool { return s == "." || s == ".." }):
		return errors.New("a client id URL may not have dot segments")
	}
	return nil
}

// fetch returns the client whose metadata document is at id.
func (f *cimdFetcher) fetch(ctx context.Context, id string) (*oauthClient, error) {
	if err := checkCIMDURL(id); err != nil {
		return nil, err
	}
	f.mu.Lock()
	e, ok := f.cache[id]
	f.mu.Unlock()
	if ok && f.now().Sub(e.at) < cimdCache {
		return e.c, nil
	}
	if !f.limit.AllowN(f.now(), 1) {
		return nil, errCIMDBusy
	}
	ctx, cancel := context.WithTimeout(ctx, cimdTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, id, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the client metadata document: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the client metadata document: %s (redirects are refused)", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCIMD+1))
	if err != nil {
		return nil, fmt.Errorf("read the client metadata document: %w", err)
	}
	if len(b) > maxCIMD {
		return nil, fmt.Errorf("the client metadata document is larger than %d bytes", maxCIMD)
	}
	var doc struct {
		oauthex.ClientRegistrationMetadata
		ClientID string `json:"client_id"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("the client metadata document is not JSON: %w", err)
	}
	if doc.ClientID != id {
		return nil, fmt.Errorf("the client metadata document's client_id is %q, not its URL", doc.ClientID)
	}
	if a := doc.TokenEndpointAuthMethod; a != "" && a != "none" {
		return nil, fmt.Errorf("the client metadata document's token_endpoint_auth_method is %q: only none", a)
	}
	c, _, err := checkClientMetadata(&doc.ClientRegistrationMetadata)
	if err != nil {
		return nil, fmt.Errorf("the client metadata document: %w", err)
	}
	c.ID, c.Document = id, true
	f.mu.Lock()
	if len(f.cache) >= cimdCacheSize {
		clear(f.cache)
	}
	f.cache[id] = cimdEntry{c: c, at: f.now()}
	f.mu.Unlock()
	return c, nil
}
