package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
	"github.com/okso-io/okso/schemas"
)

// serveHTTP serves the test upstream on 127.0.0.1 until the test ends.
func serveHTTP(t *testing.T, o testupstream.Options) (*testupstream.Upstream, *httptest.Server) {
	t.Helper()
	u := testupstream.New(o)
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	return u, srv
}

func dialHTTP(t *testing.T, url string, headers map[string]string) remote.Client {
	t.Helper()
	c, err := remote.DialHTTP(bounded(t), remote.HTTPOptions{URL: url, Headers: headers, Log: testLog(t)})
	if err != nil {
		t.Fatalf("DialHTTP: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var auth = map[string]string{"Authorization": "Bearer s3cret", "X-Test-Tenant": "demo"}

// TestHTTPListAndCall: the list, and a call whose configured headers,
// correlation headers and _meta all reach the upstream.
func TestHTTPListAndCall(t *testing.T) {
	u, srv := serveHTTP(t, testupstream.Options{Token: "s3cret", PageSize: 4})
	c := dialHTTP(t, srv.URL, auth)
	tools, err := c.List(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(tools); n != 6 {
		t.Errorf("List = %v, want 6 tools in pages of 4", toolNames(tools))
	}
	raw, err := c.Call(bounded(t), "echo", json.RawMessage(`{"message":"hi"}`), meta)
	if err != nil {
		t.Fatal(err)
	}
	var e echoed
	if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &e); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"X-Request-Id": "01JREQUEST", "Traceparent": meta["traceparent"].(string), "X-Test-Tenant": "demo"}
	for k, v := range want {
		if e.Headers[k] != v {
			t.Errorf("header %s reached the upstream as %q, want %q", k, e.Headers[k], v)
		}
	}
	for k, v := range meta {
		if e.Meta[k] != v {
			t.Errorf("_meta %s reached the upstream as %v, want %v", k, e.Meta[k], v)
		}
	}
	if n := u.Calls("echo"); n != 1 {
		t.Errorf("echo called %d times, want 1", n)
	}
	// A call without correlation sends no empty headers.
	raw, err = c.Call(bounded(t), "echo", json.RawMessage(`{"message":"hi"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	e = echoed{}
	if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &e); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.Headers["X-Request-Id"]; ok {
		t.Errorf("a call without a request id sent X-Request-Id %q", e.Headers["X-Request-Id"])
	}
}

// TestHTTPListChanged: a tool added upstream comes out of Changed.
func TestHTTPListChanged(t *testing.T) {
	u, srv := serveHTTP(t, testupstream.Options{})
	c := dialHTTP(t, srv.URL, nil)
	if _, err := c.List(bounded(t)); err != nil {
		t.Fatal(err)
	}
	u.AddTool("extra")
	select {
	case <-c.Changed():
	case <-time.After(waitLong):
		t.Fatal("no list_changed")
	}
	tools, err := c.List(bounded(t))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(toolNames(tools), "extra") {
		t.Errorf("List after list_changed = %v, want extra in it", toolNames(tools))
	}
}

// TestHTTPErrors: each failure of an HTTP upstream, classified.
func TestHTTPErrors(t *testing.T) {
	for _, path := range callPaths {
		t.Run(path.name, func(t *testing.T) { testHTTPErrors(t, path.listed) })
	}
}

// callPaths are the two ways an HTTP call goes: through the SDK's session
// until the tier has listed the upstream, as one POST of its own after.
var callPaths = []struct {
	name   string
	listed bool
}{{"before a list", false}, {"after a list", true}}

// list lists c's tools when listed is set, so that its calls go the way
// they go once the tier serves them.
func list(t *testing.T, c remote.Client, listed bool) {
	t.Helper()
	if !listed {
		return
	}
	if _, err := c.List(bounded(t)); err != nil {
		t.Fatalf("List: %v", err)
	}
}

func testHTTPErrors(t *testing.T, listed bool) {
	u, srv := serveHTTP(t, testupstream.Options{Token: "s3cret", Flaky: 1})
	c := dialHTTP(t, srv.URL, auth)
	list(t, c, listed)

	t.Run("503 is transient, and the session survives it", func(t *testing.T) {
		_, err := c.Call(bounded(t), "flaky", nil, nil)
		var st *remote.HTTPStatusError
		if !errors.As(err, &st) || st.Status != http.StatusServiceUnavailable {
			t.Errorf("flaky: %v, want an HTTPStatusError 503", err)
		}
		wantCode(t, err, schemas.CodeNodeOffline, true)
		raw, err := c.Call(bounded(t), "flaky", nil, nil)
		if err != nil {
			t.Fatalf("flaky, again: %v", err)
		}
		var a struct{ Attempt int }
		if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &a); err != nil || a.Attempt != 2 {
			t.Errorf("flaky = %s, want attempt 2", raw)
		}
	})
	t.Run("a reset is transient, after the upstream ran the call", func(t *testing.T) {
		_, err := c.Call(bounded(t), "reset", nil, nil)
		wantCode(t, err, schemas.CodeNodeOffline, true)
		if n := u.Calls("reset"); n != 1 {
			t.Errorf("reset called %d times, want 1", n)
		}
	})
	t.Run("unknown tool", func(t *testing.T) {
		_, err := c.Call(bounded(t), "nope", nil, nil)
		wantCode(t, err, schemas.CodeToolNotFound, false)
	})
	t.Run("a hang past the deadline", func(t *testing.T) {
		const deadline = 300 * time.Millisecond
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		defer cancel()
		start := time.Now()
		_, err := c.Call(ctx, "hang", nil, nil)
		if took := time.Since(start); took > deadline+time.Second {
			t.Errorf("hang returned after %v, deadline %v", took, deadline)
		}
		wantCode(t, err, schemas.CodeDeadlineExceeded, false)
		if _, err := c.Call(bounded(t), "count", nil, nil); err != nil {
			t.Errorf("after a call past its deadline: %v", err)
		}
	})
	t.Run("401", func(t *testing.T) {
		_, err := remote.DialHTTP(bounded(t), remote.HTTPOptions{URL: srv.URL, Headers: map[string]string{"Authorization": "Bearer wrong"}})
		var st *remote.HTTPStatusError
		if !errors.As(err, &st) || st.Status != http.StatusUnauthorized {
			t.Errorf("DialHTTP with a wrong token: %v, want an HTTPStatusError 401", err)
		}
		wantCode(t, err, schemas.CodeSafetyDenied, false)
	})
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = remote.DialHTTP(bounded(t), remote.HTTPOptions{URL: "http://" + addr + "/mcp"})
		wantCode(t, err, schemas.CodeNodeOffline, true)
	})
}

// TestHTTPSessionLost: an upstream that lost the session (it restarted)
// answers 404; the call fails with E_NODE_OFFLINE, Done is closed, and
// so the tier dials again at once.
func TestHTTPSessionLost(t *testing.T) {
	for _, path := range callPaths {
		t.Run(path.name, func(t *testing.T) { testHTTPSessionLost(t, path.listed) })
	}
}

func testHTTPSessionLost(t *testing.T, listed bool) {
	u, srv := serveHTTP(t, testupstream.Options{})
	c := dialHTTP(t, srv.URL, nil)
	list(t, c, listed)
	u.EndSessions()
	_, err := c.Call(bounded(t), "count", nil, nil)
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Errorf("call after the session was lost: %v, want ErrSessionMissing", err)
	}
	wantCode(t, err, schemas.CodeNodeOffline, false)
	waitClosed(t, c.Done(), "Done after the session was lost")
	_, err = c.Call(bounded(t), "count", nil, nil)
	wantCode(t, err, schemas.CodeNodeOffline, false)
	if n := u.Calls("count"); n != 0 {
		t.Errorf("count called %d times in a lost session", n)
	}
}

// TestHTTPOneCallRefused: a 4xx to one call (a proxy's 413 for large
// arguments, a 403 for one tool) fails that call, with its code, and the
// session lives on for the others.
func TestHTTPOneCallRefused(t *testing.T) {
	for _, path := range callPaths {
		t.Run(path.name, func(t *testing.T) { testHTTPOneCallRefused(t, path.listed) })
	}
}

func testHTTPOneCallRefused(t *testing.T, listed bool) {
	u := testupstream.New(testupstream.Options{})
	inner := u.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Refuse") {
		case "413":
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
		case "403":
			http.Error(w, "forbidden", http.StatusForbidden)
		default:
			inner.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	var refuse atomic.Value // the status the next POSTs get
	refuse.Store("")
	var hc http.Client
	hc.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if s := refuse.Load().(string); s != "" && r.Method == http.MethodPost {
			r = r.Clone(r.Context())
			r.Header.Set("X-Refuse", s)
		}
		return http.DefaultTransport.RoundTrip(r)
	})
	c, err := remote.DialHTTP(bounded(t), remote.HTTPOptions{URL: srv.URL, Client: &hc, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	list(t, c, listed)
	for status, code := range map[string]string{"413": schemas.CodeInternal, "403": schemas.CodeSafetyDenied} {
		refuse.Store(status)
		_, err := c.Call(bounded(t), "count", nil, nil)
		wantCode(t, err, code, false)
		refuse.Store("")
		select {
		case <-c.Done():
			t.Fatalf("a %s to one call ended the session", status)
		default:
		}
		if _, err := c.Call(bounded(t), "count", nil, nil); err != nil {
			t.Fatalf("the call after a %s: %v", status, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
