// Package bearer sends a bearer token with every HTTP request: how each
// of okso's own clients of the gateway (okso bench, okso endpoint, the
// tests and scripts) authenticates.
package bearer

import "net/http"

// Transport adds "Authorization: Bearer Token" to every request it sends
// through Base (http.DefaultTransport when nil). It leaves the caller's
// request as it was, as a RoundTripper must.
type Transport struct {
	Token string
	Base  http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.Token)
	return base.RoundTrip(r)
}
