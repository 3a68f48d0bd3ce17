package mcp

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
)

// OAuthRequest is a pending authorization request, kept in okso_oauth
// under its user code until the operator decides on it and the page
// turns it into a code, or it expires.
type OAuthRequest struct {
	UserCode    string    `json:"user_code"`
	ClientID    string    `json:"client_id"`
	ClientName  string    `json:"client_name,omitempty"`
	Document    bool      `json:"client_id_metadata_document,omitempty"`
	RedirectURI string    `json:"redirect_uri"`
	Challenge   string    `json:"code_challenge"`
	Resource    string    `json:"resource"`
	Scope       string    `json:"scope,omitempty"` // what the client asked for
	State       string    `json:"state,omitempty"`
	Issuer      string    `json:"issuer"`
	CSRF        string    `json:"csrf"` // its hash
	Expires     time.Time `json:"expires"`
}

// OAuthDecision is the operator's decision on a request (okso oauth
// approve|deny), which only the admin's NATS credential may write.
type OAuthDecision struct {
	Approved bool      `json:"approved"`
	Tenant   string    `json:"tenant,omitempty"`
	Scope    string    `json:"scope,omitempty"`
	At       time.Time `json:"at"`
}

// codeRecord is an authorization code, kept under its hash.
type codeRecord struct {
	ClientID    string    `json:"client_id"`
	RedirectURI string    `json:"redirect_uri"`
	Challenge   string    `json:"code_challenge"`
	Resource    string    `json:"resource"`
	Issuer      string    `json:"issuer"`
	Tenant      string    `json:"tenant"`
	Scope       string    `json:"scope"`
	GrantID     string    `json:"grant_id"`
	Expires     time.Time `json:"expires"`
}

// userCodeAlphabet has no vowels (no words) and none of 0, O, 1, I, L
// (no misreadings): 8 of them are 2^38 codes.
const userCodeAlphabet = "BCDFGHJKMNPQRSTVWXZ23456789"

// NormalizeUserCode is a user code as the operator may type it (any case,
// with or without its dash), as it is kept; ok false when it is not one.
func NormalizeUserCode(s string) (string, bool) {
	s = strings.ToUpper(strings.NewReplacer("-", "", " ", "").Replace(s))
	if len(s) != 8 || strings.Trim(s, userCodeAlphabet) != "" {
		return "", false
	}
	return s, true
}

// ShowUserCode is a user code as the page shows it: ABCD-EFGH.
func ShowUserCode(code string) string {
	if len(code) != 8 {
		return code
	}
	return code[:4] + "-" + code[4:]
}

func newUserCode() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = userCodeAlphabet[int(b[i])%len(userCodeAlphabet)]
	}
	return string(b)
}

// pkceChallengeRe is an S256 challenge: base64url of 32 bytes.
var pkceChallengeRe = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)

// maxAuthorizeForm bounds the page's POST.
const maxAuthorizeForm = 4 << 10

func (s *OAuthServer) serveAuthorize(w http.ResponseWriter, r *http.Request, base string) {
	switch r.Method {
	case http.MethodGet:
		s.startAuthorize(w, r, base)
	case http.MethodPost:
		s.continueAuthorize(w, r, base)
	default:
		w.Header().Set("Allow", "GET, POST")
		s.page(w, http.StatusMethodNotAllowed, pageData{Error: "Use GET, from your MCP client."}, "")
	}
}

// startAuthorize checks an authorization request and shows its page.
// Its errors are shown on the page and never sent to the redirect URI:
// anyone may register a client, so redirecting before the user or the
// operator acted would make this origin an open redirector (RFC 9700
// §4.11.2). Errors after the page's Continue or Cancel are redirected
// (continueAuthorize).
func (s *OAuthServer) startAuthorize(w http.ResponseWriter, r *http.Request, base string) {
	q := r.URL.Query()
	ctx := r.Context()
	clientID, redirect := q.Get("client_id"), q.Get("redirect_uri")
	if clientID == "" {
		s.page(w, http.StatusBadRequest, pageData{Error: "The request names no client (client_id)."}, "")
		return
	}
	c, err := s.client(ctx, clientID)
	switch {
	case errors.Is(err, errCIMDBusy):
		w.Header().Set("Retry-After", "60")
		s.page(w, http.StatusTooManyRequests, pageData{Error: "Too many sign-in requests at once. Try again in a minute."}, "")
		return
	case errors.Is(err, errUnknownClient):
		s.log.Info("oauth: authorization request of an unknown client", "client_id", clientID, "err", err)
		s.page(w, http.StatusBadRequest, pageData{Error: "Unknown client. Its registration expired or was revoked, " +
			"or its metadata document could not be fetched or is invalid: the gateway's log says which."}, "")
		return
	case err != nil:
		s.log.Error("oauth: find client", "err", err)
		s.page(w, http.StatusServiceUnavailable, pageData{Error: "The client registry is unavailable. Try again."}, "")
		return
	}
	if redirect == "" || !redirectMatches(c.RedirectURIs, redirect) {
		s.page(w, http.StatusBadRequest, pageData{Error: "The redirect URI is not one this client registered."}, "")
		return
	}
	fail := func(code, desc string) {
		status := http.StatusBadRequest
		if code == oauthTemporarilyDown {
			status = http.StatusServiceUnavailable
		}
		s.page(w, status, pageData{Error: "The client's sign-in request is refused (" + code + "): " + desc + "."}, "")
	}
	challenge, method := q.Get("code_challenge"), q.Get("code_challenge_method")
	resource := strings.TrimSuffix(q.Get("resource"), "/")
	switch {
	case q.Get("response_type") != "code":
		fail(oauthUnsupportedResponse, "response_type must be code")
		return
	case challenge == "":
		fail(oauthInvalidRequest, "PKCE is required: code_challenge with code_challenge_method S256")
		return
	case method != "S256":
		fail(oauthInvalidRequest, "code_challenge_method must be S256 (plain is refused)")
		return
	case !pkceChallengeRe.MatchString(challenge):
		fail(oauthInvalidRequest, "code_challenge is not an S256 challenge (43 base64url characters)")
		return
	case resource == "":
		fail(oauthInvalidRequest, "resource is required (RFC 8707): this server's MCP endpoint, "+resourceOf(base))
		return
	case resource != resourceOf(base):
		fail(oauthInvalidTarget, "resource must be this server's MCP endpoint, "+resourceOf(base))
		return
	case len(q.Get("state")) > 1024:
		fail(oauthInvalidRequest, "state is longer than 1024 bytes")
		return
	}
	scope := q.Get("scope")
	for _, sc := range strings.Fields(scope) {
		if !callScope(sc) {
			fail(oauthInvalidScope, fmt.Sprintf("unknown scope %q (want %s, %s or %s)", sc, auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive))
			return
		}
	}
	// Only a request found good is counted, just before it is kept in the
	// bucket: junk cannot spend the budget of real sign-ins. (Fetches of
	// metadata documents have their own bound.)
	if !s.requests.Allow() {
		w.Header().Set("Retry-After", "60")
		s.page(w, http.StatusTooManyRequests, pageData{Error: "Too many sign-in requests at once. Try again in a minute."}, "")
		return
	}
	csrf := randomToken()
	req := OAuthRequest{
		ClientID: c.ID, ClientName: c.Name, Document: c.Document, RedirectURI: redirect,
		Challenge: challenge, Resource: resource, Scope: scope, State: q.Get("state"),
		Issuer: base, CSRF: hashToken(csrf), Expires: s.o.Now().Add(s.o.RequestTTL).UTC(),
	}
	for range 4 { // a collision of user codes is rare; another code is drawn
		req.UserCode = newUserCode()
		b, _ := json.Marshal(req)
		_, err = s.o.Store.Create(ctx, bus.OAuthRequest, req.UserCode, b, s.o.RequestTTL)
		if !errors.Is(err, bus.ErrOAuthExists) {
			break
		}
	}
	if err != nil {
		s.log.Error("oauth: keep request", "err", err)
		fail(oauthTemporarilyDown, "the authorization server cannot keep the request now; try again")
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: csrfCookie(req.UserCode), Value: csrf, Path: OAuthAuthorizePath,
		MaxAge: int(s.o.RequestTTL / time.Second), HttpOnly: true, Secure: strings.HasPrefix(base, "https://"),
		SameSite: http.SameSiteStrictMode,
	})
	s.page(w, http.StatusOK, s.pageOf(&req, csrf, ""), redirect)
}

func csrfCookie(userCode string) string { return "okso_oauth_" + userCode }

// continueAuthorize is the page's POST: with the operator's approval,
// the client's code, sent to its redirect URI.
func (s *OAuthServer) continueAuthorize(w http.ResponseWriter, r *http.Request, base string) {
	if err := http.NewCrossOriginProtection().Check(r); err != nil {
		s.page(w, http.StatusForbidden, pageData{Error: "This page may be submitted only from itself."}, "")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxAuthorizeForm)
	if err := r.ParseForm(); err != nil {
		s.page(w, http.StatusBadRequest, pageData{Error: "The form is malformed."}, "")
		return
	}
	ctx := r.Context()
	code, ok := NormalizeUserCode(r.PostForm.Get("request"))
	if !ok {
		s.page(w, http.StatusBadRequest, pageData{Error: "The form names no request."}, "")
		return
	}
	req, _, err := s.request(ctx, code)
	if err == nil && !s.o.Now().Before(req.Expires) {
		err = errors.New("expired") // its key's TTL is about to take it
	}
	if err != nil {
		s.page(w, http.StatusBadRequest, pageData{Error: "This sign-in request expired or was used. Start again from your MCP client."}, "")
		return
	}
	csrf := r.PostForm.Get("csrf")
	cookie, _ := r.Cookie(csrfCookie(code))
	if csrf == "" || cookie == nil || subtle.ConstantTimeCompare([]byte(cookie.Value), []byte(csrf)) != 1 ||
		subtle.ConstantTimeCompare([]byte(hashToken(csrf)), []byte(req.CSRF)) != 1 {
		s.page(w, http.StatusForbidden, pageData{Error: "The form's CSRF token does not match this request. Start again from your MCP client."}, "")
		return
	}
	if req.Issuer != base {
		s.page(w, http.StatusBadRequest, pageData{Error: "This request was made at another address of this server."}, "")
		return
	}
	finish := func() bool {
		// The request turns into one answer only, whatever the clicks.
		_, err := s.o.Store.Create(ctx, bus.OAuthRedeemed, "req-"+code, []byte("1"), s.o.RequestTTL)
		if err != nil {
			s.page(w, http.StatusBadRequest, pageData{Error: "This sign-in request was used already. Start again from your MCP client."}, "")
			return false
		}
		_ = s.o.Store.Delete(ctx, bus.OAuthRequest, code) // it expires anyway
		return true
	}
	if r.PostForm.Get("action") == "cancel" {
		if finish() {
			redirectError(w, r, req.RedirectURI, req.State, base, oauthAccessDenied, "the user cancelled the request")
		}
		return
	}
	d, err := s.decision(ctx, code)
	switch {
	case errors.Is(err, bus.ErrOAuthNotFound):
		s.page(w, http.StatusOK, s.pageOf(req, csrf, "Not approved yet: the operator has not run the command below. Continue once they have."), req.RedirectURI)
		return
	case err != nil:
		s.log.Error("oauth: read decision", "err", err)
		s.page(w, http.StatusServiceUnavailable, s.pageOf(req, csrf, "The authorization server cannot read the operator's decision now; try again."), req.RedirectURI)
		return
	}
	if !finish() {
		return
	}
	if !d.Approved {
		redirectError(w, r, req.RedirectURI, req.State, base, oauthAccessDenied, "the operator denied the request")
		return
	}
	authCode := randomToken()
	rec := codeRecord{
		ClientID: req.ClientID, RedirectURI: req.RedirectURI, Challenge: req.Challenge, Resource: req.Resource,
		Issuer: base, Tenant: d.Tenant, Scope: d.Scope, GrantID: "g" + strings.ToLower(rand.Text()),
		Expires: s.o.Now().Add(s.o.CodeTTL).UTC(),
	}
	b, _ := json.Marshal(rec)
	if _, err := s.o.Store.Create(ctx, bus.OAuthCode, hashToken(authCode), b, s.o.CodeTTL); err != nil {
		s.log.Error("oauth: keep code", "err", err)
		redirectError(w, r, req.RedirectURI, req.State, base, oauthServerError, "the authorization server could not keep the code")
		return
	}
	s.log.Info("oauth request approved", "user_code", code, "client_id", req.ClientID, "tenant", d.Tenant, "scope", d.Scope, "grant", rec.GrantID)
	redirectTo(w, r, req.RedirectURI, url.Values{"code": {authCode}, "state": nonEmpty(req.State), "iss": {base}})
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// request reads the pending request of a user code.
func (s *OAuthServer) request(ctx context.Context, code string) (*OAuthRequest, uint64, error) {
	return ReadOAuthRequest(ctx, s.o.Store, code)
}

// ReadOAuthRequest reads the pending request of a user code (as
// [NormalizeUserCode] returns it): what okso oauth approve shows the
// operator before it writes the decision.
func ReadOAuthRequest(ctx context.Context, st *bus.OAuthStore, code string) (*OAuthRequest, uint64, error) {
	b, rev, err := st.Get(ctx, bus.OAuthRequest, code)
	if err != nil {
		return nil, 0, err
	}
	var req OAuthRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, 0, fmt.Errorf("oauth request %s: %w", code, err)
	}
	return &req, rev, nil
}

// DecideOAuthRequest writes the operator's decision on the pending
// request of a user code: approved for tenant with scopes, or denied.
// Only the admin's NATS credential may (bus.OAuthConsent).
func DecideOAuthRequest(ctx context.Context, st *bus.OAuthStore, code string, d OAuthDecision) (*OAuthRequest, error) {
	req, _, err := ReadOAuthRequest(ctx, st, code)
	if errors.Is(err, bus.ErrOAuthNotFound) {
		return nil, fmt.Errorf("no pending sign-in request %s (expired, used, or mistyped?)", ShowUserCode(code))
	}
	if err != nil {
		return nil, err
	}
	if d.Approved {
		if !tenantNameRe.MatchString(d.Tenant) {
			return nil, fmt.Errorf("tenant %q: want 1-64 of A-Z a-z 0-9 _ -", d.Tenant)
		}
		scopes := strings.Fields(d.Scope)
		if len(scopes) == 0 {
			return nil, errors.New("give the scopes to grant (--scope)")
		}
		for _, sc := range scopes {
			if !callScope(sc) {
				return nil, fmt.Errorf("scope %q: want %s, %s or %s", sc, auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive)
			}
		}
		d.Scope = strings.Join(scopes, " ")
	}
	ttl := time.Until(req.Expires)
	if ttl <= 0 {
		return nil, fmt.Errorf("sign-in request %s expired", ShowUserCode(code))
	}
	b, _ := json.Marshal(d)
	if err := st.Put(ctx, bus.OAuthConsent, code, b, ttl); err != nil {
		return nil, err
	}
	return req, nil
}

// callScope reports whether sc is one of the scopes a grant may carry.
func callScope(sc string) bool {
	return sc == auth.ScopeReadOnly || sc == auth.ScopeMutating || sc == auth.ScopeDestructive
}

var tenantNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (s *OAuthServer) decision(ctx context.Context, code string) (*OAuthDecision, error) {
	b, _, err := s.o.Store.Get(ctx, bus.OAuthConsent, code)
	if err != nil {
		return nil, err
	}
	var d OAuthDecision
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("oauth decision %s: %w", code, err)
	}
	return &d, nil
}

// redirectError sends an error to the client's redirect URI, with the
// request's state and the issuer (RFC 9207).
func redirectError(w http.ResponseWriter, r *http.Request, redirect, state, iss, code, desc string) {
	redirectTo(w, r, redirect, url.Values{"error": {code}, "error_description": {desc}, "state": nonEmpty(state), "iss": {iss}})
}

func redirectTo(w http.ResponseWriter, r *http.Request, redirect string, params url.Values) {
	u, err := url.Parse(redirect)
	if err != nil { // checked when the client registered
		http.Error(w, "bad redirect URI", http.StatusBadRequest)
		return
	}
	q := u.Query()
	for k, v := range params {
		for _, x := range v {
			q.Add(k, x)
		}
	}
	u.RawQuery = q.Encode()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

// pageData is what the authorize page shows.
type pageData struct {
	Error    string
	Notice   string
	UserCode string
	Client   string
	ClientID string
	Document bool
	Redirect string
	Scope    string
	Command  string
	CSRF     string
	Nonce    string
	Minutes  int
}

func (s *OAuthServer) pageOf(req *OAuthRequest, csrf, notice string) pageData {
	scope := req.Scope
	if scope == "" {
		scope = auth.ScopeReadOnly
	}
	redirect := req.RedirectURI
	if u, err := url.Parse(req.RedirectURI); err == nil {
		redirect = u.Scheme + "://" + u.Host
	}
	return pageData{
		Notice: notice, UserCode: ShowUserCode(req.UserCode), Client: req.ClientName, ClientID: req.ClientID,
		Document: req.Document, Redirect: redirect, Scope: req.Scope, CSRF: csrf,
		Command: "okso oauth approve " + ShowUserCode(req.UserCode) + " --tenant TENANT --scope " + scope,
		Minutes: max(1, int(time.Until(req.Expires).Minutes()+0.5)),
	}
}

// page writes the authorize page: no script, no frame, no secret asked
// for; its one form posts back here with the request's CSRF token.
// formTo is the redirect URI the form's answer sends the browser to
// (CSP form-action covers the redirect that follows a submission).
func (s *OAuthServer) page(w http.ResponseWriter, status int, d pageData, formTo string) {
	d.Nonce = randomToken()
	action := "'self'"
	if u, err := url.Parse(formTo); err == nil && formTo != "" {
		if u.Host != "" {
			action += " " + u.Scheme + "://" + u.Host
		} else {
			action += " " + u.Scheme + ":"
		}
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'nonce-"+d.Nonce+"'; form-action "+action+
		"; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := authorizePage.Execute(w, d); err != nil {
		s.log.Warn("oauth: write page", "err", err)
	}
}

var authorizePage = template.Must(template.New("authorize").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>okso: sign-in request</title>
<style nonce="{{.Nonce}}">body{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:2em auto;padding:0 1em}
code,.code{font-family:ui-monospace,monospace}.code{font-size:2em;letter-spacing:.1em}
.err{color:#a00}.note{background:#ffd;padding:.5em}pre{background:#eee;padding:.5em;white-space:pre-wrap}</style>
</head><body>
<h1>okso sign-in request</h1>
{{if .Error}}<p class="err">{{.Error}}</p>{{else}}
{{if .Notice}}<p class="note">{{.Notice}}</p>{{end}}
<p>Request code:</p><p class="code">{{.UserCode}}</p>
<p><b>{{if .Client}}{{.Client}}{{else}}An unnamed client{{end}}</b> asks to call this okso's tools.<br>
Client id: <code>{{.ClientID}}</code>{{if .Document}} (its metadata document){{else}} (registered here){{end}}<br>
It will receive its token at <code>{{.Redirect}}</code>.{{if .Scope}}<br>Scopes asked for: <code>{{.Scope}}</code>{{end}}</p>
<p>This page asks for no password or key. The operator of this okso approves the request
with their admin credential, by its code, for a tenant and scopes of their choosing:</p>
<pre>{{.Command}}</pre>
<p>Check that the code above is the one you give them. Then continue. The request expires in about {{.Minutes}} minutes.</p>
<form method="post">
<input type="hidden" name="request" value="{{.UserCode}}">
<input type="hidden" name="csrf" value="{{.CSRF}}">
<button type="submit" name="action" value="continue">Continue</button>
<button type="submit" name="action" value="cancel">Cancel</button>
</form>{{end}}
</body></html>
`))
