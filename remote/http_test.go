package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// callEcho calls the test upstream's echo through c, with meta, and
// returns what the upstream saw of the request.
func callEcho(t *testing.T, c remote.Client, meta map[string]any) echoed {
	t.Helper()
	raw, err := c.Call(bounded(t), "echo", json.RawMessage(`{"message":"hi"}`), meta)
	if err != nil {
		t.Fatal(err)
	}
	var e echoed
	if err := json.Unmarshal(decodeResult(t, raw).StructuredContent, &e); err != nil {
		t.Fatal(err)
	}
	return e
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
	e := callEcho(t, c, meta)
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
	e = callEcho(t, c, nil)
	if _, ok := e.Headers["X-Request-Id"]; ok {
		t.Errorf("a call without a request id sent X-Request-Id %q", e.Headers["X-Request-Id"])
	}
}

// TestHTTPRevision: once listed, a stateless upstream of 2026-07-28 that
// serves 2025-11-25 too is called in 2025-11-25, whose calls cost a
// server less (no client _meta to read and check on each); a stateful
// one in its session's revision, and one of 2026-07-28 alone in that
// revision. Either way the calls carry the correlation.
func TestHTTPRevision(t *testing.T) {
	for _, up := range []struct {
		name    string
		handler func(*testupstream.Upstream) http.Handler
		want    map[bool]string // by listed
	}{
		{"stateful", (*testupstream.Upstream).Handler, map[bool]string{false: "2025-11-25", true: "2025-11-25"}},
		{"stateless, every revision", (*testupstream.Upstream).StatelessHandler, map[bool]string{false: "2026-07-28", true: "2025-11-25"}},
		{"2026-07-28 alone", (*testupstream.Upstream).ModernHandler, map[bool]string{false: "2026-07-28", true: "2026-07-28"}},
	} {
		for _, path := range callPaths {
			t.Run(up.name+", "+path.name, func(t *testing.T) {
				srv := httptest.NewServer(up.handler(testupstream.New(testupstream.Options{})))
				t.Cleanup(srv.Close)
				c := dialHTTP(t, srv.URL, nil)
				list(t, c, path.listed)
				for range 2 { // the first and the next
					e := callEcho(t, c, meta)
					if got, want := e.Headers["Mcp-Protocol-Version"], up.want[path.listed]; got != want {
						t.Errorf("the call's Mcp-Protocol-Version = %q, want %q", got, want)
					}
					for k, v := range meta {
						if e.Meta[k] != v {
							t.Errorf("_meta %s reached the upstream as %v, want %v", k, e.Meta[k], v)
						}
					}
					if e.Headers["X-Request-Id"] != meta[schemas.MetaRequestID] {
						t.Errorf("X-Request-Id reached the upstream as %q, want %v", e.Headers["X-Request-Id"], meta[schemas.MetaRequestID])
					}
				}
			})
		}
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

// pinged is a ping as it reached the upstream.
type pinged struct {
	meta   map[string]any
	header http.Header
}

// pingGate serves an upstream whose pings are answered as the test
// says: by the MCP handler (answer ""), or by one of pingAnswers; with
// every, its other POSTs are answered so too. Every ping that reaches it
// is sent on seen, when there is room; release ends the silent answers,
// so that the server can close.
type pingGate struct {
	inner   http.Handler
	every   bool         // set before it serves
	answer  atomic.Value // string
	seen    chan pinged
	release chan struct{}
}

// pings waits for n pings to reach the upstream, from now.
func (g *pingGate) pings(t *testing.T, n int) {
	t.Helper()
	for len(g.seen) > 0 {
		<-g.seen
	}
	for i := range n {
		select {
		case <-g.seen:
		case <-time.After(waitLong):
			t.Fatalf("%d pings within %v, want %d", i, waitLong, n)
		}
	}
}

func newPingGate(t *testing.T, inner http.Handler) *pingGate {
	g := &pingGate{inner: inner, seen: make(chan pinged, 64), release: make(chan struct{})}
	g.answer.Store("")
	return g
}

func (g *pingGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		g.inner.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Meta map[string]any `json:"_meta"`
		} `json:"params"`
	}
	ping := json.Unmarshal(body, &msg) == nil && msg.Method == "ping"
	if ping {
		select {
		case g.seen <- pinged{meta: msg.Params.Meta, header: r.Header.Clone()}:
		default:
		}
	}
	answer := g.answer.Load().(string)
	if answer == "" || !ping && !g.every {
		g.inner.ServeHTTP(w, r)
		return
	}
	pingAnswers[answer](w, r, msg.ID, g.release)
}

// pingAnswers are the ways an upstream, or what stands in front of it,
// may answer a ping; alive says whether the upstream answered.
var pingAnswers = map[string]func(w http.ResponseWriter, r *http.Request, id json.RawMessage, release <-chan struct{}){
	"200 and -32601": func(w http.ResponseWriter, r *http.Request, id json.RawMessage, _ <-chan struct{}) {
		rpcError(w, http.StatusOK, id, -32601, "method not found")
	},
	"400 and -32602": func(w http.ResponseWriter, r *http.Request, id json.RawMessage, _ <-chan struct{}) {
		rpcError(w, http.StatusBadRequest, id, -32602, `missing or invalid _meta field "io.modelcontextprotocol/protocolVersion"`)
	},
	"400 and -32600 of no id": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		rpcError(w, http.StatusBadRequest, json.RawMessage("null"), -32600, "invalid request")
	},
	"404 and -32601": func(w http.ResponseWriter, r *http.Request, id json.RawMessage, _ <-chan struct{}) {
		rpcError(w, http.StatusNotFound, id, -32601, `method not found: "ping"`)
	},
	"500 and -32603": func(w http.ResponseWriter, r *http.Request, id json.RawMessage, _ <-chan struct{}) {
		rpcError(w, http.StatusInternalServerError, id, -32603, "internal error")
	},
	"an event stream and -32601": func(w http.ResponseWriter, r *http.Request, id json.RawMessage, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"error\":{\"code\":-32601,\"message\":\"method not found\"}}\n\n", id)
	},
	"a proxy's 502 page": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html><body><h1>502 Bad Gateway</h1></body></html>")
	},
	"a plain 400": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		http.Error(w, "bad request", http.StatusBadRequest)
	},
	"a 200 page": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html><body>Sign in</body></html>")
	},
	"an event stream that ends unanswered": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n")
	},
	"a reset": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, _ <-chan struct{}) {
		panic(http.ErrAbortHandler)
	},
	"silence": func(w http.ResponseWriter, r *http.Request, _ json.RawMessage, release <-chan struct{}) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	},
}

func rpcError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q}}`, id, code, msg)
}

// pinger is a Client of an MCP upstream, which the tier asks whether the
// upstream is there.
type pinger interface {
	Ping(ctx context.Context) error
}

// TestHTTPPing: whatever revision an upstream speaks, any JSON-RPC answer
// to a ping says it is there, a result or an error object, whatever the
// HTTP status that carries it; a transport failure, silence, and an
// answer that is not JSON-RPC say it may not be.
func TestHTTPPing(t *testing.T) {
	answers := []struct {
		answer string
		alive  bool
	}{
		{"", true}, // the SDK's result
		{"200 and -32601", true},
		{"400 and -32602", true},
		{"400 and -32600 of no id", true},
		{"404 and -32601", true},
		{"500 and -32603", true},
		{"an event stream and -32601", true},
		{"a proxy's 502 page", false},
		{"a plain 400", false},
		{"a 200 page", false},
		{"an event stream that ends unanswered", false},
		{"a reset", false},
		{"silence", false},
	}
	for _, a := range answers {
		name := a.answer
		if name == "" {
			name = "a result"
		}
		t.Run(name, func(t *testing.T) {
			g := newPingGate(t, testupstream.New(testupstream.Options{}).Handler())
			srv := httptest.NewServer(g)
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(g.release) })
			c := dialHTTP(t, srv.URL, nil)
			list(t, c, true)
			g.answer.Store(a.answer)
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			err := c.(pinger).Ping(ctx)
			if a.alive && err != nil {
				t.Errorf("Ping = %v, want nil: the upstream answered", err)
			}
			if !a.alive && err == nil {
				t.Error("Ping = nil, want an error: the upstream did not answer")
			}
		})
	}

	// An upstream of 2026-07-28 alone is pinged in that revision's
	// shape, which it answers 404 and -32601.
	t.Run("2026-07-28 alone", func(t *testing.T) {
		g := newPingGate(t, testupstream.New(testupstream.Options{}).ModernHandler())
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		c := dialHTTP(t, srv.URL, nil)
		list(t, c, true)
		if err := c.(pinger).Ping(bounded(t)); err != nil {
			t.Errorf("Ping = %v, want nil", err)
		}
		p := <-g.seen
		if v := p.meta[mcp.MetaKeyProtocolVersion]; v != "2026-07-28" {
			t.Errorf("the ping's _meta %s = %v, want 2026-07-28", mcp.MetaKeyProtocolVersion, v)
		}
		for k, v := range map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "ping"} {
			if got := p.header.Get(k); got != v {
				t.Errorf("the ping's %s header = %q, want %q", k, got, v)
			}
		}
	})
}
