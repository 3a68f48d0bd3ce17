package bench

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const testToken = "secret"

// server is an in-process go-sdk MCP server with three echo tools, a tool
// that always answers isError with a code, and bearer auth. It counts the
// calls of each tool.
type server struct {
	url string
	mu  sync.Mutex
	n   map[string]int
}

func (s *server) counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[string]int{}
	for k, v := range s.n {
		m[k] = v
	}
	return m
}

func startServer(t *testing.T, stateless bool, pageSize int) *server {
	t.Helper()
	srv := &server{n: map[string]int{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ServerOptions{PageSize: pageSize})
	obj := &jsonschema.Schema{Type: "object"}
	for _, name := range []string{"echo.a", "echo.b", "echo.c"} {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: obj}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			srv.mu.Lock()
			srv.n[name]++
			srv.mu.Unlock()
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}},
				StructuredContent: req.Params.Arguments,
			}, nil
		})
	}
	s.AddTool(&mcp.Tool{Name: "limited", InputSchema: obj}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		env := map[string]any{"code": "E_RATE_LIMITED", "category": "transient", "message": "slow down"}
		b, _ := json.Marshal(env)
		return &mcp.CallToolResult{IsError: true, Meta: mcp.Meta{"io.okso/error": env}, // as okso answers
			Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: stateless})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	srv.url = hs.URL
	return srv
}

// quick is a run of 60 calls: as long as they take, so that a loaded
// machine makes it slower, never empty.
func quick(url, tool string) Options {
	return Options{URL: url, Token: testToken, Tool: tool, Sessions: 2, Concurrency: 6, Calls: 60}
}

// checkLatency: percentiles in order, and the histogram holds every ok
// operation.
func checkLatency(t *testing.T, r *Result) {
	t.Helper()
	l := r.Latency
	if !(0 < l.Min && l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("latency out of order: %+v", l)
	}
	var n uint64
	for _, b := range r.Histogram {
		n += b.Count
	}
	if n != r.OK {
		t.Errorf("histogram holds %d, want the %d ok operations", n, r.OK)
	}
}

// TestBenchCallSpread: a prefix spreads the calls round-robin over every
// matching tool, on stateful and stateless servers alike.
func TestBenchCallSpread(t *testing.T) {
	for _, stateless := range []bool{false, true} {
		t.Run(map[bool]string{false: "stateful", true: "stateless"}[stateless], func(t *testing.T) {
			srv := startServer(t, stateless, 0)
			var progress strings.Builder
			o := quick(srv.url, "echo.*")
			o.Progress = &progress
			// A timed run: its duration and its progress line.
			o.Calls, o.Duration, o.Warmup = 0, 1200*time.Millisecond, 100*time.Millisecond
			r, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if r.Tools != 3 || r.OK == 0 || r.Ops != r.OK || len(r.Errors) != 0 {
				t.Fatalf("tools %d, ok %d of %d, errors %v; want 3 tools and every call ok", r.Tools, r.OK, r.Ops, r.Errors)
			}
			if r.OKPerS <= 0 || math.Abs(r.Duration-1.2) > 1e-9 || r.Protocol == "" {
				t.Errorf("ok/s %v, duration %v, protocol %q", r.OKPerS, r.Duration, r.Protocol)
			}
			checkLatency(t, r)
			c := counts(srv.counts())
			if len(c) != 3 || c.max()-c.min() > 1 {
				t.Errorf("calls per tool %v: want three tools within one call of each other", srv.counts())
			}
			if !strings.Contains(progress.String(), " done ") {
				t.Errorf("no progress line in %q", progress.String())
			}
			var text strings.Builder
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"tools/call echo.* (3 tools)", "calls/s", "p50", "histogram", "≤ "} {
				if !strings.Contains(text.String(), want) {
					t.Errorf("report lacks %q:\n%s", want, text.String())
				}
			}
		})
	}
}

// TestBenchMaxTools: --max-tools confines the calls to the first tools
// the pattern matches.
func TestBenchMaxTools(t *testing.T) {
	srv := startServer(t, true, 0)
	o := quick(srv.url, "echo.*")
	o.MaxTools = 2
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if c := srv.counts(); r.Tools != 2 || len(c) != 2 || r.OK == 0 {
		t.Fatalf("tools %d, calls per tool %v: want 2 tools called", r.Tools, c)
	}
}

type counts map[string]int

func (c counts) min() int {
	m := -1
	for _, v := range c {
		if m < 0 || v < m {
			m = v
		}
	}
	return m
}

func (c counts) max() int {
	m := 0
	for _, v := range c {
		m = max(m, v)
	}
	return m
}

// TestBenchCallErrors: failed calls are counted by code and not timed.
func TestBenchCallErrors(t *testing.T) {
	srv := startServer(t, true, 0)
	tests := []struct {
		tool, code string
	}{
		{"limited", "E_RATE_LIMITED"},
		{"nope", "jsonrpc -32602"},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			r, err := Run(t.Context(), quick(srv.url, tt.tool))
			if err != nil {
				t.Fatal(err)
			}
			if r.OK != 0 || r.Ops == 0 || r.Errors[tt.code] != r.Ops || len(r.Errors) != 1 {
				t.Fatalf("ok %d of %d, errors %v; want every call failed with %s", r.OK, r.Ops, r.Errors, tt.code)
			}
			if r.Examples[tt.code] == "" {
				t.Errorf("no example message for %s", tt.code)
			}
			if r.Latency.Max != 0 || len(r.Histogram) != 0 {
				t.Errorf("failed calls were timed: %+v", r.Latency)
			}
		})
	}
}

// TestBenchList: an operation is a whole listing, every page of it.
func TestBenchList(t *testing.T) {
	srv := startServer(t, false, 2) // 4 tools: 2 pages
	o := quick(srv.url, "echo.*")
	o.Mode = ModeList
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.OK == 0 || r.Ops != r.OK || r.PagesPerList != 2 || r.Pages != 2*r.OK || r.Tools != 3 {
		t.Fatalf("ok %d of %d, %d pages (%d per listing), %d tools; want 2 pages per listing, 3 matching tools",
			r.OK, r.Ops, r.Pages, r.PagesPerList, r.Tools)
	}
	checkLatency(t, r)
	if p := r.PageLatency; p == nil || p.P50 <= 0 || p.P50 > r.Latency.P50 {
		t.Errorf("page latency %+v against listing latency %+v", p, r.Latency)
	}
}

// TestBenchProtocol: the requested protocol version is the one used.
func TestBenchProtocol(t *testing.T) {
	srv := startServer(t, true, 0)
	o := quick(srv.url, "echo.a")
	o.Protocol = "2025-06-18"
	o.Duration = 100 * time.Millisecond
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Protocol != "2025-06-18" || r.OK == 0 {
		t.Errorf("protocol %q, ok %d", r.Protocol, r.OK)
	}
}

// TestBenchInterrupted: a cancelled run stops at once and reports what it
// measured.
func TestBenchInterrupted(t *testing.T) {
	srv := startServer(t, true, 0)
	o := quick(srv.url, "echo.*")
	o.Calls, o.Duration, o.Warmup = 0, time.Minute, -1
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	r, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("an interrupted run took %v", took)
	}
	if !r.Interrupted || r.OK == 0 || r.Duration <= 0 || r.Duration > 5 {
		t.Errorf("interrupted %v, ok %d, duration %v s", r.Interrupted, r.OK, r.Duration)
	}
}

// TestBenchRefusals: bad options and unreachable or refusing servers fail
// before any load.
func TestBenchRefusals(t *testing.T) {
	srv := startServer(t, true, 0)
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no tool", func(o *Options) { o.Tool = "" }, "no tool"},
		{"bad mode", func(o *Options) { o.Mode = "stream" }, "mode"},
		{"args not an object", func(o *Options) { o.Args = json.RawMessage(`[1]`) }, "JSON object"},
		{"args not JSON", func(o *Options) { o.Args = json.RawMessage(`{`) }, "JSON object"},
		{"no matching tool", func(o *Options) { o.Tool = "zzz*" }, "no tool"},
		{"wrong token", func(o *Options) { o.Token = "wrong" }, "connect"},
		{"nothing listening", func(o *Options) { o.URL = "http://127.0.0.1:1/mcp" }, "connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := quick(srv.url, "echo.*")
			tt.edit(&o)
			_, err := Run(t.Context(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run gave %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestBenchRecordAllocs: timing and counting a call allocates nothing.
func TestBenchRecordAllocs(t *testing.T) {
	var w worker
	if n := testing.AllocsPerRun(1000, func() {
		t0 := time.Now()
		w.lat.Record(time.Since(t0))
		w.ok++
	}); n != 0 {
		t.Errorf("timing a call allocates %v times", n)
	}
}

// TestBenchCalls: Calls runs exactly that many calls, each counted, in
// call and raw mode alike, whatever time they take; subscribe mode has
// no such count.
func TestBenchCalls(t *testing.T) {
	for _, mode := range []string{ModeCall, ModeRaw} {
		t.Run(mode, func(t *testing.T) {
			srv := startServer(t, true, 0)
			o := quick(srv.url, "echo.*")
			o.Mode, o.Calls = mode, 37
			r, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			sum := 0
			for _, n := range srv.counts() {
				sum += n
			}
			if r.Ops != 37 || r.OK != 37 || sum != 37 {
				t.Errorf("ops %d, ok %d, the server served %d; want 37 of each", r.Ops, r.OK, sum)
			}
		})
	}
	o := quick("http://127.0.0.1:1/mcp", "echo.*")
	o.Mode = ModeSubscribe
	if _, err := Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "subscribe") {
		t.Errorf("calls in subscribe mode: %v", err)
	}
}
