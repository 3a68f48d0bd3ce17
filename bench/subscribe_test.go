package bench

import (
	"context"
	"encoding/json"
	"fmt"
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

// burst is the number of frames a good test stream sends as soon as it
// opens, before its one ping; then it stays quiet until the client leaves,
// so the frames a run counts are exact.
const burst = 3

// door imitates okso's gateway for subscribe mode: tools/list at /mcp
// (two tools per page) and the streaming door at /mcp/tools/call. The
// tools sys.{a,b,c}.metrics.subscribe stream well; each bad.* one fails
// in its own way; sys.a.metrics.snapshot is unary.
type door struct {
	url   string      // the MCP endpoint
	args  string      // the arguments every request must carry
	ended chan string // a stream handler returned

	mu      sync.Mutex
	streams map[string]int // requests per tool
}

var doorTools = []string{
	"sys.a.metrics.subscribe", "sys.b.metrics.subscribe", "sys.c.metrics.subscribe", "sys.a.metrics.snapshot",
	"bad.full.metrics.subscribe", "bad.quota.metrics.subscribe", "bad.gone.metrics.subscribe", "bad.eof.metrics.subscribe",
}

func startDoor(t *testing.T, args string) *door {
	t.Helper()
	d := &door{args: args, ended: make(chan string, 256), streams: map[string]int{}}
	s := mcp.NewServer(&mcp.Implementation{Name: "door", Version: "1"}, &mcp.ServerOptions{PageSize: 2})
	for _, name := range doorTools {
		s.AddTool(&mcp.Tool{Name: name, InputSchema: &jsonschema.Schema{Type: "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return nil, fmt.Errorf("%s is for the streaming door", name)
			})
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	mux.HandleFunc("POST /mcp/tools/call", d.serve)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	d.url = hs.URL + "/mcp"
	return d
}

func (d *door) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Tool      string          `json:"tool"`
		Arguments json.RawMessage `json:"arguments"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || string(body.Arguments) != d.args ||
		r.Header.Get("Content-Type") != "application/json" {
		http.Error(w, fmt.Sprintf("body %+v (%v), Content-Type %q", body, err, r.Header.Get("Content-Type")), http.StatusBadRequest)
		return
	}
	d.mu.Lock()
	d.streams[body.Tool]++
	d.mu.Unlock()
	defer func() { d.ended <- body.Tool }()
	if body.Tool == "sys.a.metrics.snapshot" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"cpu_pct":1}`))
		return
	}
	if r.Header.Get("Accept") != "text/event-stream" {
		http.Error(w, "Accept "+r.Header.Get("Accept"), http.StatusNotAcceptable)
		return
	}
	if body.Tool == "bad.full.metrics.subscribe" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"code":"E_RATE_LIMITED","category":"transient","message":"slow down"}`))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(event, data string) {
		_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, data)
		_ = rc.Flush()
	}
	frame := `{"ts_ms":1,"node_id":"n","cpu_pct":1}`
	switch body.Tool {
	case "bad.quota.metrics.subscribe":
		send("close", `{"code":4429,"reason":"rate_limited"}`)
		return
	case "bad.gone.metrics.subscribe":
		send("metric", frame)
		send("close", `{"code":4503,"reason":"device_offline"}`)
		return
	case "bad.eof.metrics.subscribe":
		send("metric", frame)
		return
	}
	for range burst {
		send("metric", frame)
	}
	_, _ = w.Write([]byte(": a comment\n\n")) // ignored
	send("ping", "{}")
	<-r.Context().Done() // the client left
}

// requests returns the requests per tool so far.
func (d *door) requests() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string]int{}
	for k, v := range d.streams {
		m[k] = v
	}
	return m
}

// waitEnded waits until n stream handlers have returned: the client closed
// every stream it held.
func (d *door) waitEnded(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for i := range n {
		select {
		case <-d.ended:
		case <-timeout:
			t.Fatalf("%d of %d streams still open on the server", n-i, n)
		}
	}
}

func subscribeOpts(url, tool string, streams int) Options {
	return Options{URL: url, Token: testToken, Tool: tool, Mode: ModeSubscribe, Sessions: 2,
		Concurrency: streams, Duration: time.Second, Warmup: -1}
}

// TestBenchSubscribe: a pattern spreads the streams round-robin over the
// matching tools of every page; every frame in the measured time counts,
// and every stream is closed at the end.
func TestBenchSubscribe(t *testing.T) {
	d := startDoor(t, DefaultSubscribeArgs)
	var progress strings.Builder
	o := subscribeOpts(d.url, "sys.*.metrics.subscribe", 6)
	o.Progress = &progress
	o.Duration = 1500 * time.Millisecond // a progress line comes every second
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	d.waitEnded(t, 6)
	if r.Tools != 3 || r.Ops != 6 || r.OK != 6 || r.StreamsOpened != 6 || r.StreamsOpen != 6 || len(r.Errors) != 0 {
		t.Fatalf("tools %d, streams %d: %d opened, %d open to the end (ok %d), errors %v %v; want 3 tools, 6 streams held",
			r.Tools, r.Ops, r.StreamsOpened, r.StreamsOpen, r.OK, r.Errors, r.Examples)
	}
	if got := d.requests(); len(got) != 3 || got["sys.a.metrics.subscribe"] != 2 ||
		got["sys.b.metrics.subscribe"] != 2 || got["sys.c.metrics.subscribe"] != 2 {
		t.Errorf("streams per tool %v: want 2 on each of sys.{a,b,c}.metrics.subscribe", got)
	}
	if r.Frames != 6*burst || r.Pings != 6 {
		t.Errorf("%d frames, %d pings; want %d and 6", r.Frames, r.Pings, 6*burst)
	}
	if want := 6 * burst / r.Duration; math.Abs(r.FramesPerS-want) > 1e-9 {
		t.Errorf("frames/s %v, want %v", r.FramesPerS, want)
	}
	if s, want := r.StreamFramesPS, burst/r.Duration; s == nil || math.Abs(s.Min-want) > 1e-9 ||
		math.Abs(s.Max-want) > 1e-9 || math.Abs(s.Mean-want) > 1e-9 {
		t.Errorf("per stream %+v, want %v each", s, want)
	}
	if f := r.FirstFrame; f == nil || !(0 < f.Min && f.Min <= f.P50 && f.P50 <= f.Max) {
		t.Errorf("first frame latency %+v", f)
	}
	var n uint64
	for _, b := range r.Histogram {
		n += b.Count
	}
	if n != 6 {
		t.Errorf("histogram holds %d first frames, want 6", n)
	}
	if r.StreamURL != strings.TrimSuffix(d.url, "/mcp")+"/mcp/tools/call" || r.Protocol == "" || r.Interrupted {
		t.Errorf("stream url %q, protocol %q, interrupted %v", r.StreamURL, r.Protocol, r.Interrupted)
	}
	if !strings.Contains(progress.String(), " open ") {
		t.Errorf("no progress line in %q", progress.String())
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"subscribe sys.*.metrics.subscribe (3 tools)", "6 open to the end, 6 opened, 0 failed",
		"frames/s", "per stream", "1st frame", "histogram"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
}

// TestBenchSubscribeWarmup: frames of the warm-up do not count; the
// streams still do, and so does the time to their first frame.
func TestBenchSubscribeWarmup(t *testing.T) {
	d := startDoor(t, `{"interval_ms":2000}`)
	o := subscribeOpts(d.url, "sys.b.metrics.subscribe", 2)
	o.Args = json.RawMessage(`{"interval_ms":2000}`)
	o.Warmup, o.Duration = time.Second, 100*time.Millisecond
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	d.waitEnded(t, 2)
	if r.Tools != 1 || r.StreamsOpen != 2 || r.Frames != 0 || r.Pings != 0 || r.FirstFrame == nil {
		t.Errorf("tools %d, %d open, %d frames, %d pings, first frame %v; want 2 streams, nothing counted but the first frames",
			r.Tools, r.StreamsOpen, r.Frames, r.Pings, r.FirstFrame)
	}
}

// TestBenchSubscribeErrors: a stream refused, closed early or not an event
// stream counts once, under its code.
func TestBenchSubscribeErrors(t *testing.T) {
	d := startDoor(t, DefaultSubscribeArgs)
	tests := []struct {
		tool, code, example string
		opened              uint64
	}{
		{"bad.full.metrics.subscribe", "http/429", "E_RATE_LIMITED", 0},
		{"bad.quota.metrics.subscribe", "close/4429", "rate_limited", 3},
		{"bad.gone.metrics.subscribe", "close/4503", "device_offline", 3},
		{"bad.eof.metrics.subscribe", CodeClosed, "without a close event", 3},
		{"sys.a.metrics.snapshot", CodeNotSSE, "application/json", 0},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			o := subscribeOpts(d.url, tt.tool, 3)
			o.Duration = 100 * time.Millisecond
			r, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			d.waitEnded(t, 3)
			if r.Ops != 3 || r.OK != 0 || r.StreamsOpen != 0 || r.StreamsOpened != tt.opened ||
				len(r.Errors) != 1 || r.Errors[tt.code] != 3 {
				t.Fatalf("%d streams: %d opened, %d held, errors %v; want 3 × %s, %d opened",
					r.Ops, r.StreamsOpened, r.StreamsOpen, r.Errors, tt.code, tt.opened)
			}
			if !strings.Contains(r.Examples[tt.code], tt.example) {
				t.Errorf("example of %s: %q, want it to mention %q", tt.code, r.Examples[tt.code], tt.example)
			}
		})
	}
	t.Run("mixed", func(t *testing.T) {
		o := subscribeOpts(d.url, "*.metrics.subscribe", 7)
		o.Duration = 100 * time.Millisecond
		r, err := Run(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		d.waitEnded(t, 7)
		want := map[string]uint64{"http/429": 1, "close/4429": 1, "close/4503": 1, CodeClosed: 1}
		if r.Tools != 7 || r.StreamsOpen != 3 || r.StreamsOpened != 6 || fmt.Sprint(r.Errors) != fmt.Sprint(want) {
			t.Errorf("tools %d, %d opened, %d held, errors %v; want 7 tools, 6 opened, 3 held, errors %v",
				r.Tools, r.StreamsOpened, r.StreamsOpen, r.Errors, want)
		}
		var text strings.Builder
		_ = r.WriteText(&text)
		if !strings.Contains(text.String(), "3 open to the end, 6 opened, 4 failed") || !strings.Contains(text.String(), "close/4503") {
			t.Errorf("report:\n%s", text.String())
		}
	})
}

// opens is a transport that reports each stream it opened.
type opens struct {
	base   *http.Transport
	opened chan struct{}
}

func (o opens) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := o.base.RoundTrip(r)
	if err == nil && r.URL.Path == "/mcp/tools/call" && resp.StatusCode == http.StatusOK {
		o.opened <- struct{}{}
	}
	return resp, err
}

// TestBenchSubscribeInterrupted: a cancelled run closes every stream at
// once and reports them held; a caller's transport carries them.
func TestBenchSubscribeInterrupted(t *testing.T) {
	d := startDoor(t, DefaultSubscribeArgs)
	tr := opens{base: &http.Transport{}, opened: make(chan struct{}, 4)}
	defer tr.base.CloseIdleConnections()
	o := subscribeOpts(d.url, "sys.*.metrics.subscribe", 4)
	o.Duration, o.Transport = time.Minute, tr
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		defer cancel()
		for range 4 {
			select {
			case <-tr.opened:
			case <-ctx.Done():
				return
			}
		}
	}()
	t0 := time.Now()
	r, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	d.waitEnded(t, 4)
	if took := time.Since(t0); took > 10*time.Second {
		t.Errorf("an interrupted run took %v", took)
	}
	if !r.Interrupted || r.StreamsOpen != 4 || len(r.Errors) != 0 || r.Duration <= 0 || r.Duration > 10 {
		t.Errorf("interrupted %v, %d held, errors %v, duration %v s", r.Interrupted, r.StreamsOpen, r.Errors, r.Duration)
	}
}

// TestBenchSubscribeRefusals: no tool, no matching tool, or a URL with no
// streaming door fail before any stream opens.
func TestBenchSubscribeRefusals(t *testing.T) {
	d := startDoor(t, DefaultSubscribeArgs)
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no tool", func(o *Options) { o.Tool = "" }, "no tool"},
		{"only a star", func(o *Options) { o.Tool = "*" }, "no tool"},
		{"no matching tool", func(o *Options) { o.Tool = "sys.*.metrics.stream" }, "no tool"},
		{"not http", func(o *Options) { o.URL = "ws://127.0.0.1:1/mcp"; o.Tool = "sys.a.metrics.subscribe" }, "want http"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := subscribeOpts(d.url, "sys.*.metrics.subscribe", 2)
			tt.edit(&o)
			_, err := Run(t.Context(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run gave %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if got := d.requests(); len(got) != 0 {
		t.Errorf("streams requested: %v", got)
	}
}

// TestMatch: "*" stands for any run of characters, anywhere.
func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"sysecho.*", "sysecho.n1.echo.invoke", true},
		{"sysecho.*", "sys.n1.metrics.subscribe", false},
		{"sys.*.metrics.subscribe", "sys.n1.metrics.subscribe", true},
		{"sys.*.metrics.subscribe", "sys.n1.metrics.snapshot", false},
		{"sys.*.metrics.subscribe", "sysecho.n1.metrics.subscribe", false},
		{"*.metrics.subscribe", "sys.n1.metrics.subscribe", true},
		{"*", "anything", true},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a*b*c", "abxbc", true},
		{"a*b*c", "acb", false},
		{"echo.a", "echo.a", true},
		{"echo.a", "echo.ab", false},
		{"sysecho.*", "sysecho-n1-echo-invoke", true}, // okso's listed (safe) form
		{"sys.*.metrics.subscribe", "sys-n1-metrics-subscribe", true},
		{"sys-*-metrics-subscribe", "sys.n1.metrics.subscribe", true},
		{"sys.*.metrics.subscribe", "sys-n1-metrics-snapshot", false},
	}
	for _, tt := range tests {
		if got := match(tt.pattern, tt.name); got != tt.want {
			t.Errorf("match(%q, %q) = %v, want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}
