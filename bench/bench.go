// Package bench is okso's load generator for any MCP server that speaks
// Streamable HTTP: it opens MCP client sessions with the official Go SDK,
// keeps a fixed number of tools/call (or tools/list) requests in flight for
// a duration after a warm-up, and reports the rate, the errors by code and
// the latency distribution. Its subscribe mode holds many of okso's
// metric streams open instead (POST /mcp/tools/call as Server-Sent Events)
// and counts the frames they deliver. Its raw mode drives a stateless
// server as wrk would, bare HTTP POSTs of tools/call on keep-alive
// connections, but checks that every answer echoes its call.
//
// Start with [Run] and an [Options] value; print the [Result] with
// [Result.WriteText] or encode it as JSON. `okso bench` is the command
// around it.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/schemas"
)

// Modes of [Options.Mode].
const (
	ModeCall      = "call"      // tools/call
	ModeList      = "list"      // a full tools/list, every page
	ModeSubscribe = "subscribe" // streams held open on okso's SSE door
	// ModeRaw is tools/call as bare HTTP POSTs without an MCP session, one
	// keep-alive connection per request in flight, each answer checked for
	// the call's echo (see raw.go).
	ModeRaw = "raw"
)

// Defaults of [Options].
const (
	DefaultURL         = "http://127.0.0.1:8080/mcp"
	DefaultSessions    = 8
	DefaultConcurrency = 64
	DefaultDuration    = 10 * time.Second
	DefaultWarmup      = 2 * time.Second
	DefaultArgs        = `{"message":"bench"}`
	// DefaultSubscribeArgs are the arguments of subscribe mode: a metrics
	// sample every second.
	DefaultSubscribeArgs = `{"interval_ms":1000}`
)

// Error codes of failures that carry no code of the server's.
const (
	CodeIsError   = "isError"           // an isError result without structuredContent.code
	CodeClosed    = "transport/closed"  // the MCP session broke, or a stream ended without a close event
	CodeTimeout   = "transport/timeout" // a deadline passed
	CodeTransport = "transport"         // any other failure to exchange the request
)

// forCalls is the time a run of Calls operations has: as long as they
// take.
const forCalls = 24 * time.Hour

// more reports whether a worker starts another operation: always while
// the time lasts, and while tickets last when Calls is set.
func (o *Options) more() bool { return o.Calls == 0 || o.tickets.Add(1) <= o.Calls }

// drainGrace bounds how long the requests still in flight at the end may
// take before they are cancelled; they are not counted either way.
const drainGrace = 10 * time.Second

// Options configure [Run]. Every zero value means the default.
type Options struct {
	URL         string        // MCP endpoint (DefaultURL)
	Token       string        // bearer token; none when empty
	Sessions    int           // MCP client sessions, at most Concurrency (8); subscribe and raw mode open one, to list tools
	Concurrency int           // requests in flight in total (64); in subscribe mode, streams held open; in raw mode, connections
	Duration    time.Duration // measured time (10 s)
	// Warmup runs before the measured time and is not counted (2 s); a
	// negative Warmup means none.
	Warmup time.Duration
	// Calls, when positive, runs exactly that many operations (calls,
	// listings) in all, each counted, and ignores Duration and Warmup:
	// a run as long as the server takes, such as a test's on a loaded
	// machine. Not in subscribe mode.
	Calls uint64
	// tickets counts the operations taken, when Calls is set (made by
	// defaults).
	tickets *atomic.Uint64
	// Tool is the tool to call: an exact name, or a pattern in which each
	// "*" stands for any run of characters ("sysecho.*",
	// "sys.*.metrics.subscribe") that spreads the calls round-robin over
	// every listed tool it matches. Required in call and subscribe mode;
	// in list mode it only filters the count of matching tools reported.
	Tool string
	Args json.RawMessage // arguments, a JSON object (DefaultArgs; DefaultSubscribeArgs in subscribe mode)
	Mode string          // ModeCall, ModeList, ModeSubscribe or ModeRaw (ModeCall)
	// Protocol is the MCP protocol version to request; the SDK's latest
	// when empty (raw mode: RawProtocol, sent as Mcp-Protocol-Version).
	Protocol string
	// MaxTools, when positive, keeps only the first MaxTools tools (in
	// listing order) that Tool matches: the same fleet can then be driven
	// over a few nodes or over all of them.
	MaxTools int
	// Progress, when set, gets a line every second: requests so far, the
	// current rate and the errors.
	Progress io.Writer
	// Transport carries the HTTP requests; a fresh one sized for
	// Concurrency when nil. In subscribe mode each stream holds one of its
	// connections for the whole run.
	Transport http.RoundTripper
}

// Result is the outcome of [Run]. Latencies are of successful operations.
//
// In subscribe mode an operation is a stream: Ops counts the streams asked
// for, OK those held open to the end, Errors why the others were refused
// or ended early ("http/429", "close/4429", a transport code), and the
// histogram is of FirstFrame.
type Result struct {
	URL         string  `json:"url"`
	Mode        string  `json:"mode"`
	Tool        string  `json:"tool,omitempty"`
	Tools       int     `json:"tools"` // tools called, or listed (matching Tool, if set) per listing
	Sessions    int     `json:"sessions"`
	Concurrency int     `json:"concurrency"`
	Protocol    string  `json:"protocol"` // as negotiated
	Warmup      float64 `json:"warmup_s"`
	Duration    float64 `json:"duration_s"` // measured, shorter than asked when interrupted
	Interrupted bool    `json:"interrupted,omitempty"`

	Ops      uint64            `json:"ops"` // operations that completed in the measured time
	OK       uint64            `json:"ok"`
	Errors   map[string]uint64 `json:"errors"`
	Examples map[string]string `json:"error_examples,omitempty"` // the first message of each code
	OpsPerS  float64           `json:"ops_per_s"`
	OKPerS   float64           `json:"ok_per_s"`
	// Reconnects counts sessions (raw mode: connections) opened again
	// after theirs broke.
	Reconnects uint64 `json:"reconnects"`

	Latency   Latency `json:"latency_ms"`
	Histogram []BinMS `json:"histogram"`

	// List mode: each page, and pages per listing.
	Pages        uint64   `json:"pages,omitempty"`
	PageLatency  *Latency `json:"page_latency_ms,omitempty"`
	PagesPerList int      `json:"pages_per_list,omitempty"`

	// Subscribe mode: the streaming door used, the streams that got an
	// event stream and those still open at the end, the metric frames and
	// pings they received in the measured time, the rate of each stream
	// held to the end, and the time from request to first frame.
	StreamURL      string       `json:"stream_url,omitempty"`
	StreamsOpened  uint64       `json:"streams_opened,omitempty"`
	StreamsOpen    uint64       `json:"streams_open,omitempty"`
	Frames         uint64       `json:"frames,omitempty"`
	FramesPerS     float64      `json:"frames_per_s,omitempty"`
	StreamFramesPS *StreamRates `json:"stream_frames_per_s,omitempty"`
	Pings          uint64       `json:"pings,omitempty"`
	FirstFrame     *Latency     `json:"first_frame_latency_ms,omitempty"`
}

// StreamRates are frames per second of each stream.
type StreamRates struct {
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// Latency summarises a [Histogram] in milliseconds.
type Latency struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// BinMS is a [Bin] in milliseconds.
type BinMS struct {
	LeMS  float64 `json:"le_ms"`
	Count uint64  `json:"count"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func summarise(h *Histogram) Latency {
	return Latency{Min: ms(h.Min()), Mean: ms(h.Mean()), P50: ms(h.Quantile(0.50)),
		P90: ms(h.Quantile(0.90)), P99: ms(h.Quantile(0.99)), Max: ms(h.Max())}
}

func (o *Options) defaults() error {
	if o.URL == "" {
		o.URL = DefaultURL
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Sessions == 0 {
		o.Sessions = DefaultSessions
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	switch {
	case o.Calls > 0:
		o.Warmup, o.Duration, o.tickets = 0, forCalls, new(atomic.Uint64)
	case o.Warmup == 0:
		o.Warmup = DefaultWarmup
	case o.Warmup < 0:
		o.Warmup = 0
	}
	if o.Mode == "" {
		o.Mode = ModeCall
	}
	if len(o.Args) == 0 {
		o.Args = json.RawMessage(DefaultArgs)
		if o.Mode == ModeSubscribe {
			o.Args = json.RawMessage(DefaultSubscribeArgs)
		}
	}
	switch {
	case o.Concurrency < 1:
		return fmt.Errorf("concurrency %d: want at least 1", o.Concurrency)
	case o.Sessions < 1:
		return fmt.Errorf("sessions %d: want at least 1", o.Sessions)
	case o.Duration < 0:
		return fmt.Errorf("duration %v: want a positive one", o.Duration)
	case o.Mode != ModeCall && o.Mode != ModeList && o.Mode != ModeSubscribe && o.Mode != ModeRaw:
		return fmt.Errorf("mode %q: want %s, %s, %s or %s", o.Mode, ModeCall, ModeList, ModeSubscribe, ModeRaw)
	case o.Calls > 0 && o.Mode == ModeSubscribe:
		return errors.New("calls: a number of operations, not of streams: not in subscribe mode")
	case o.Mode != ModeList && strings.Trim(o.Tool, "*") == "":
		return errors.New("no tool: give a name, or a pattern with * (e.g. 'sysecho.*')")
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(o.Args, &args); err != nil || args == nil {
		return fmt.Errorf("args %s: want a JSON object", o.Args)
	}
	o.Sessions = min(o.Sessions, o.Concurrency)
	return nil
}

// client opens MCP sessions to one endpoint.
type client struct {
	o    *Options
	mcp  *mcp.Client
	http *http.Client
}

func (c *client) connect(ctx context.Context) (*mcp.ClientSession, error) {
	s, err := c.mcp.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   c.o.URL,
		HTTPClient: c.http,
		MaxRetries: -1,
	}, &mcp.ClientSessionOptions{ProtocolVersion: c.o.Protocol})
	if err != nil {
		return nil, fmt.Errorf("connect MCP session to %s: %w", c.o.URL, err)
	}
	return s, nil
}

// slot is one session shared by several workers, opened again when it
// breaks.
type slot struct {
	mu sync.Mutex
	s  *mcp.ClientSession
}

func (sl *slot) get() *mcp.ClientSession {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return sl.s
}

// renew replaces broken (if it is still the slot's session) with a new one;
// it reports whether it opened one.
func (sl *slot) renew(ctx context.Context, c *client, broken *mcp.ClientSession) (*mcp.ClientSession, bool, error) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.s != broken {
		return sl.s, false, nil
	}
	_ = broken.Close()
	s, err := c.connect(ctx)
	if err != nil {
		return broken, false, err
	}
	sl.s = s
	return s, true, nil
}

// worker is the state one goroutine owns; merged after the run.
type worker struct {
	lat, page  Histogram
	ok, failed uint64
	pages      uint64
	reconnects uint64
	errs       map[string]uint64
	examples   map[string]string
	tools      int // matching tools in the last listing
	perList    int // pages in the last listing
}

func (w *worker) fail(code, msg string) {
	if w.errs == nil {
		w.errs, w.examples = map[string]uint64{}, map[string]string{}
	}
	w.errs[code]++
	if _, ok := w.examples[code]; !ok {
		w.examples[code] = msg
	}
}

// Run connects the sessions, finds the tools, and runs the load. It
// returns an error when it cannot start; failed requests are counted in
// the [Result], not returned. When ctx ends early, Run stops and returns
// what it measured, marked Interrupted.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	tr := o.Transport
	if tr == nil {
		t := &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        2*o.Concurrency + 2*o.Sessions,
			MaxIdleConnsPerHost: 2*o.Concurrency + 2*o.Sessions,
			IdleConnTimeout:     90 * time.Second,
		}
		defer t.CloseIdleConnections()
		tr = t
	}
	if o.Token != "" {
		tr = bearer.Transport{Token: o.Token, Base: tr}
	}
	c := &client{o: &o, http: &http.Client{Transport: tr},
		mcp: mcp.NewClient(&mcp.Implementation{Name: "okso-bench", Version: "1"}, nil)}

	res := &Result{URL: o.URL, Mode: o.Mode, Tool: o.Tool, Sessions: o.Sessions,
		Concurrency: o.Concurrency, Warmup: o.Warmup.Seconds(), Errors: map[string]uint64{}}

	// The tools come from a session of their own: a session that listed
	// tools looks each called name up in what it listed.
	tools := []string{o.Tool}
	if strings.Contains(o.Tool, "*") && o.Mode != ModeList {
		var err error
		if tools, res.Protocol, err = listMatching(ctx, c, o.Tool); err != nil {
			return nil, err
		}
		if o.MaxTools > 0 && len(tools) > o.MaxTools {
			tools = tools[:o.MaxTools]
		}
	}
	res.Tools = len(tools)
	if o.Mode == ModeSubscribe {
		res.Sessions = 0 // none held: the listing's is closed
		return runSubscribe(ctx, &o, c.http, tools, res)
	}
	if o.Mode == ModeRaw {
		res.Sessions = 0 // one connection per request in flight, no session
		return runRaw(ctx, &o, tools, res)
	}

	slots := make([]*slot, o.Sessions)
	defer func() {
		for _, sl := range slots {
			if sl != nil {
				_ = sl.get().Close()
			}
		}
	}()
	for i := range slots {
		s, err := c.connect(ctx)
		if err != nil {
			return nil, err
		}
		slots[i] = &slot{s: s}
	}
	if ir := slots[0].get().InitializeResult(); ir != nil {
		res.Protocol = ir.ProtocolVersion
	}

	var (
		done, failed atomic.Uint64 // every completed request, warm-up included
		next         atomic.Uint64 // round-robin over tools
		workers      = make([]worker, o.Concurrency)
		wg           sync.WaitGroup
		stop         = make(chan struct{})
		start        = time.Now()
		end          = o.Warmup + o.Duration
	)
	// Requests still in flight when the time is up get drainGrace, then
	// their context ends.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	drainDone := drain(ctx, cancel, stop, end)
	for i := range workers {
		w, sl := &workers[i], slots[i%len(slots)]
		wg.Go(func() {
			if o.Mode == ModeList {
				w.runList(runCtx, ctx, c, sl, &o, start, end, &done, &failed)
			} else {
				w.runCall(runCtx, ctx, c, sl, &o, tools, &next, start, end, &done, &failed)
			}
		})
	}
	progressDone := progressCalls(&o, stop, start, &done, &failed)
	wg.Wait()
	close(stop)
	<-progressDone
	<-drainDone

	measured := min(time.Since(start), end) - o.Warmup
	res.Interrupted = ctx.Err() != nil
	var page Histogram
	for i := range workers {
		w := &workers[i]
		page.Merge(&w.page)
		res.Pages += w.pages
		if o.Mode == ModeList && w.perList > 0 {
			res.Tools, res.PagesPerList = w.tools, w.perList
		}
	}
	res.tally(workers, measured)
	if o.Mode == ModeList {
		pl := summarise(&page)
		res.PageLatency = &pl
	}
	return res, nil
}

// drain ends the run's requests once the time is up (end after the
// start) and drainGrace more has passed, or at once when ctx ends; it
// stops watching when stop is closed. The channel it returns is closed
// when it is done.
func drain(ctx context.Context, cancel context.CancelFunc, stop <-chan struct{}, end time.Duration) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			cancel()
			return
		case <-stop:
			return
		case <-time.After(end):
		}
		select {
		case <-ctx.Done():
		case <-stop:
		case <-time.After(drainGrace):
		}
		cancel()
	}()
	return done
}

// progressCalls writes o.Progress's line of a call run until stop is
// closed; the channel it returns is closed when it is done.
func progressCalls(o *Options, stop <-chan struct{}, start time.Time, done, failed *atomic.Uint64) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		defer close(out)
		progress(o.Progress, stop, start, o.Warmup, done.Load, func(n uint64, rate float64) string {
			return fmt.Sprintf("%9d done  %8.0f/s  %6d errors", n, rate, failed.Load())
		})
	}()
	return out
}

// tally adds up what the workers counted over the measured time: the
// operations and their outcomes, the rates and the latency.
func (res *Result) tally(workers []worker, measured time.Duration) {
	var lat Histogram
	for i := range workers {
		w := &workers[i]
		lat.Merge(&w.lat)
		res.OK += w.ok
		res.Reconnects += w.reconnects
		res.Ops += w.ok + w.failed
		for k, n := range w.errs {
			res.Errors[k] += n
		}
		for k, m := range w.examples {
			if res.Examples == nil {
				res.Examples = map[string]string{}
			}
			if _, ok := res.Examples[k]; !ok {
				res.Examples[k] = m
			}
		}
	}
	if measured > 0 {
		res.Duration = measured.Seconds()
		res.OpsPerS = float64(res.Ops) / measured.Seconds()
		res.OKPerS = float64(res.OK) / measured.Seconds()
	}
	res.Latency = summarise(&lat)
	for _, b := range lat.Bins() {
		res.Histogram = append(res.Histogram, BinMS{LeMS: ms(b.Le), Count: b.Count})
	}
}

// listMatching lists every tool, following pagination, and returns the
// names that match pattern and the protocol the session negotiated.
func listMatching(ctx context.Context, c *client, pattern string) ([]string, string, error) {
	s, err := c.connect(ctx)
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	var names []string
	for t, err := range s.Tools(ctx, nil) {
		if err != nil {
			return nil, "", fmt.Errorf("list tools at %s: %w", c.o.URL, err)
		}
		if match(pattern, t.Name) {
			names = append(names, t.Name)
		}
	}
	if len(names) == 0 {
		return nil, "", fmt.Errorf("no tool at %s matches %q", c.o.URL, pattern)
	}
	var proto string
	if ir := s.InitializeResult(); ir != nil {
		proto = ir.ProtocolVersion
	}
	return names, proto, nil
}

// match reports whether name matches pattern, in which each "*" stands for
// any run of characters (none included), a "." or "-" for either (okso
// lists "sysecho-<node>-echo-invoke" by default, "sysecho.<node>.echo.invoke"
// in the seed form, and a pattern of either form matches both), and
// everything else for itself; a prefix ending in "*" is the common case.
// Tool names hold no "*" of their own, so none needs escaping.
func match(pattern, name string) bool {
	dash := func(s string) string { return strings.ReplaceAll(s, ".", "-") }
	pattern, name = dash(pattern), dash(name)
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return name == pattern
	}
	rest, ok := strings.CutPrefix(name, parts[0])
	if !ok {
		return false
	}
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return strings.HasSuffix(rest, last)
}

// runCall calls tools until the time is up. ctx is the run's (it ends
// after the drain), parent the caller's (it stops new calls).
func (w *worker) runCall(ctx, parent context.Context, c *client, sl *slot, o *Options, tools []string,
	next *atomic.Uint64, start time.Time, end time.Duration, done, failed *atomic.Uint64) {
	// One params value per worker, reused: CallTool only fills in what is
	// missing (the new protocol's _meta, once).
	params := &mcp.CallToolParams{Arguments: o.Args}
	s := sl.get()
	for parent.Err() == nil && time.Since(start) < end && o.more() {
		params.Name = tools[(next.Add(1)-1)%uint64(len(tools))]
		t0 := time.Now()
		r, err := s.CallTool(ctx, params)
		t1 := time.Now()
		counted := t1.Sub(start) >= o.Warmup && t1.Sub(start) < end
		done.Add(1)
		if err == nil && !r.IsError {
			if counted {
				w.ok++
				w.lat.Record(t1.Sub(t0))
			}
			continue
		}
		failed.Add(1)
		var code, msg string
		if err != nil {
			code, msg = classifyErr(ctx, err)
		} else {
			code, msg = classifyResult(r)
		}
		if counted {
			w.failed++
			w.fail(code, msg)
		}
		if code == CodeClosed {
			s = w.renew(ctx, c, sl, s, counted)
		}
	}
}

// runList lists every tool, page by page, until the time is up.
func (w *worker) runList(ctx, parent context.Context, c *client, sl *slot, o *Options,
	start time.Time, end time.Duration, done, failed *atomic.Uint64) {
	s := sl.get()
	var page Histogram // this listing's pages, kept if it counts
	for parent.Err() == nil && time.Since(start) < end && o.more() {
		page = Histogram{}
		var (
			params   = &mcp.ListToolsParams{}
			tools, n int
			err      error
		)
		t0 := time.Now()
		for {
			p0 := time.Now()
			var r *mcp.ListToolsResult
			if r, err = s.ListTools(ctx, params); err != nil {
				break
			}
			page.Record(time.Since(p0))
			n++
			for _, t := range r.Tools {
				if o.Tool == "" || match(o.Tool, t.Name) {
					tools++
				}
			}
			if r.NextCursor == "" {
				break
			}
			params = &mcp.ListToolsParams{Cursor: r.NextCursor}
		}
		t1 := time.Now()
		counted := t1.Sub(start) >= o.Warmup && t1.Sub(start) < end
		done.Add(1)
		if err == nil {
			if counted {
				w.ok++
				w.lat.Record(t1.Sub(t0))
				w.page.Merge(&page)
				w.pages += uint64(n)
				w.tools, w.perList = tools, n
			}
			continue
		}
		failed.Add(1)
		code, msg := classifyErr(ctx, err)
		if counted {
			w.failed++
			w.fail(code, msg)
		}
		if code == CodeClosed {
			s = w.renew(ctx, c, sl, s, counted)
		}
	}
}

// renew opens the slot's session again, pausing after a failure so that a
// dead server does not spin the worker.
func (w *worker) renew(ctx context.Context, c *client, sl *slot, s *mcp.ClientSession, counted bool) *mcp.ClientSession {
	ns, opened, err := sl.renew(ctx, c, s)
	switch {
	case err != nil:
		if counted {
			w.fail("reconnect", err.Error())
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	case opened:
		w.reconnects++
	}
	return ns
}

// classifyErr names the failure of a request: the JSON-RPC error code
// (with the code of an error envelope in its data, if any), or a transport
// failure.
func classifyErr(ctx context.Context, err error) (code, msg string) {
	msg = err.Error()
	var je *jsonrpc.Error
	switch {
	case errors.Is(err, mcp.ErrConnectionClosed):
		// Before jsonrpc.Error: a closed connection is one too (-32003).
		return CodeClosed, msg
	case errors.Is(err, context.DeadlineExceeded), ctx.Err() != nil:
		return CodeTimeout, msg
	case errors.As(err, &je):
		code = fmt.Sprintf("jsonrpc %d", je.Code)
		var env struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(je.Data, &env) == nil && env.Code != "" {
			code += " " + env.Code
		}
		return code, msg
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return CodeTimeout, msg
	}
	return CodeTransport, msg
}

// classifyResult names an isError result by the code of its envelope:
// okso's in _meta (schemas.MetaError), another server's in its
// structuredContent or its text content.
func classifyResult(r *mcp.CallToolResult) (code, msg string) {
	if m, ok := r.Meta[schemas.MetaError].(map[string]any); ok {
		if c, ok := m["code"].(string); ok && c != "" {
			msg, _ := m["message"].(string)
			return c, msg
		}
	}
	if m, ok := r.StructuredContent.(map[string]any); ok {
		if c, ok := m["code"].(string); ok && c != "" {
			msg, _ := m["message"].(string)
			return c, msg
		}
	}
	for _, ct := range r.Content {
		if t, ok := ct.(*mcp.TextContent); ok {
			var env struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if json.Unmarshal([]byte(t.Text), &env) == nil && env.Code != "" {
				return env.Code, env.Message
			}
			return CodeIsError, t.Text
		}
	}
	return CodeIsError, ""
}

// progress writes a line to w every second until stop closes: count is
// the running total whose rate the line shows, and line formats the rest.
func progress(w io.Writer, stop <-chan struct{}, start time.Time, warmup time.Duration,
	count func() uint64, line func(n uint64, rate float64) string) {
	if w == nil {
		<-stop
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last uint64
	lastAt := start
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			n := count()
			phase := ""
			if now.Sub(start) < warmup {
				phase = " (warm-up)"
			}
			fmt.Fprintf(w, "%5.0fs  %s%s\n", now.Sub(start).Seconds(), line(n, float64(n-last)/now.Sub(lastAt).Seconds()), phase)
			last, lastAt = n, now
		}
	}
}
