package mcp

import (
	"net/http"
	"strings"
	"testing"
)

// TestCorrelation: a well-formed traceparent and request id of the client
// travel on; anything else is replaced by a fresh one, and a fresh
// traceparent is well formed and not sampled.
func TestCorrelation(t *testing.T) {
	const theirs = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name, traceparent, requestID string
		keep                         bool
	}{
		{"the client's", theirs, "req-1", true},
		{"none", "", "", false},
		{"malformed", "00-xyz-00f067aa0ba902b7-01", "bad id with spaces", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", strings.Repeat("x", 129), false},
		{"upper case", strings.ToUpper(theirs), "", false},
	} {
		t.Run(tc.name+", in _meta", func(t *testing.T) {
			// MCP 2026-07-28 carries it in _meta, which wins over the header.
			h := http.Header{}
			h.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4799-00f067aa0ba902b7-01")
			_, tp, given := correlation(h, tc.traceparent)
			if tc.keep && (tp != tc.traceparent || !given) {
				t.Errorf("_meta %q: got %q (%v), want it", tc.traceparent, tp, given)
			}
			if !tc.keep && tp != h.Get("traceparent") {
				t.Errorf("_meta %q: got %q, want the header's", tc.traceparent, tp)
			}
		})
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.traceparent != "" {
				h.Set("traceparent", tc.traceparent)
			}
			if tc.requestID != "" {
				h.Set("X-Request-Id", tc.requestID)
			}
			id, tp, given := correlation(h, "")
			if given != tc.keep {
				t.Errorf("given %v, want %v", given, tc.keep)
			}
			if tc.keep {
				if tp != tc.traceparent || id != tc.requestID {
					t.Fatalf("got %q %q, want the client's %q %q", id, tp, tc.requestID, tc.traceparent)
				}
				return
			}
			if tp == tc.traceparent || !traceparentRe.MatchString(tp) || tp[3:35] == zeroTraceID || !strings.HasSuffix(tp, "-00") {
				t.Errorf("fresh traceparent %q: want a well-formed, unsampled one", tp)
			}
			if id == tc.requestID || !requestIDRe.MatchString(id) {
				t.Errorf("fresh request id %q: want a well-formed one", id)
			}
		})
	}
}
