// Command relaybench is the load of scripts/relay-bench.sh (make
// relay-bench), a tool and not part of okso. It plays two agents of one
// tenant, both official Go SDK clients on Streamable HTTP: a listener
// that holds caller_tools_listen on one gateway replica with one tool,
// bench_echo, and answers each caller_tool_request at once with
// caller_tool_response (its arguments as the result), on -answer-url;
// and a caller that calls bench_echo on another replica.
//
// In order: a warm-up at -concurrency in flight; a snapshot of each
// gateway's goroutines and heap (from its --debug-addr, after a GC, with
// the clients' idle connections closed); -calls relayed calls at
// -concurrency in flight, each result checked against its arguments; the
// same snapshot again (and, with -settle, a third that much later);
// -duration at one call in flight; -duration at -concurrency in flight
// (okso's load generator, package bench, for both), with a CPU profile of
// each gateway, and of relaybench itself, written to -profile-dir. The
// figures go to stdout as one JSON object, progress to stderr. It exits 1
// when a phase could not run or a relayed call failed.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/bench"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
)

// The declared tool, as the others list it: {caller_id}_{tool}.
const (
	callerID = "bench"
	toolName = "echo"
	listed   = callerID + "_" + toolName
	decl     = `{"caller_id":"` + callerID + `","tools":[{"name":"` + toolName + `","description":"Echoes its arguments.",` +
		`"inputSchema":{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}}]}`
)

type options struct {
	listenURL, answerURL, callURL string
	listenToken, callToken        string
	debug                         []gateway
	duration, warmup              time.Duration
	calls, concurrency, sessions  int
	profileDir                    string
	pprofAddr                     string
	settle                        time.Duration
	gcPercent                     int
}

// gateway is a replica's debug listener, named for the report.
type gateway struct{ name, url string }

func main() {
	var o options
	var debugURLs string
	flag.StringVar(&o.listenURL, "listen-url", "", "MCP endpoint of the replica the listener holds its listen on")
	flag.StringVar(&o.answerURL, "answer-url", "", "MCP endpoint the listener answers on (default -listen-url)")
	flag.StringVar(&o.callURL, "call-url", "", "MCP endpoint of the replica the caller calls on")
	flag.StringVar(&debugURLs, "debug", "", "NAME=http://host:port of each gateway's --debug-addr, comma separated")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured time of each timed phase")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up of each timed phase, and before the first snapshot")
	flag.IntVar(&o.calls, "calls", 100000, "relayed calls between the two snapshots")
	flag.IntVar(&o.concurrency, "concurrency", 64, "calls in flight in the loaded phases")
	flag.IntVar(&o.sessions, "sessions", 8, "the caller's MCP sessions in the loaded phases")
	flag.StringVar(&o.profileDir, "profile-dir", "", "write each gateway's CPU profile of the loaded timed phase here")
	flag.DurationVar(&o.settle, "settle", 0, "after the second snapshot, wait this long and take a third (e.g. the gateways' --caller-timeout, "+
		"by which every relayed call's own timer has run out)")
	flag.IntVar(&o.gcPercent, "gc-percent", 100, "relaybench's own GOGC (debug.SetGCPercent); the gateways are not affected")
	flag.StringVar(&o.pprofAddr, "pprof-addr", "", "serve relaybench's own profiles (/debug/pprof/) on host:port, to tell its limits from the gateways'")
	flag.Parse()
	o.listenToken, o.callToken = os.Getenv("RELAYBENCH_LISTEN_TOKEN"), os.Getenv("RELAYBENCH_CALL_TOKEN")
	if o.answerURL == "" {
		o.answerURL = o.listenURL
	}
	for kv := range strings.SplitSeq(debugURLs, ",") {
		if name, url, ok := strings.Cut(kv, "="); ok {
			o.debug = append(o.debug, gateway{name, strings.TrimSuffix(url, "/")})
		}
	}
	if o.listenURL == "" || o.callURL == "" || o.listenToken == "" || o.callToken == "" || o.calls < 1 || o.concurrency < 1 {
		fmt.Fprintln(os.Stderr, "relaybench: -listen-url, -call-url, -calls, -concurrency and the tokens "+
			"(RELAYBENCH_LISTEN_TOKEN, RELAYBENCH_CALL_TOKEN) are required")
		os.Exit(2)
	}
	debug.SetGCPercent(o.gcPercent)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.pprofAddr != "" {
		ln, err := net.Listen("tcp", o.pprofAddr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "relaybench: -pprof-addr:", err)
			os.Exit(2)
		}
		progress("profiles at http://%s/debug/pprof/", ln.Addr())
		go func() { _ = http.Serve(ln, nil) }() // net/http/pprof's handlers, on the default mux
	}
	rep, err := run(ctx, o)
	if rep != nil {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relaybench:", err)
		os.Exit(1)
	}
}

// report is what relaybench prints.
type report struct {
	ListenID  string        `json:"listen_id"`
	ListenURL string        `json:"listen_url"`
	AnswerURL string        `json:"answer_url"`
	CallURL   string        `json:"call_url"`
	Relay     *relayResult  `json:"relay"`
	Gateways  []gatewayRun  `json:"gateways"`
	C1        *bench.Result `json:"c1"`
	CN        *bench.Result `json:"cn"`
	Listener  listenerStats `json:"listener"`
	Profiles  []string      `json:"profiles,omitempty"`
}

// gatewayRun is one gateway's snapshots around the relayed calls.
type gatewayRun struct {
	Name    string    `json:"name"`
	Before  snapshot  `json:"before"`
	After   snapshot  `json:"after"`
	Settled *snapshot `json:"settled,omitempty"` // -settle after After
}

// snapshot is a gateway's goroutines and heap (runtime.MemStats after a GC).
type snapshot struct {
	Goroutines  int    `json:"goroutines"`
	HeapInuse   uint64 `json:"heap_inuse"`
	HeapAlloc   uint64 `json:"heap_alloc"`
	HeapObjects uint64 `json:"heap_objects"`
}

// relayResult is the counted phase.
type relayResult struct {
	Calls   int               `json:"calls"`
	OK      uint64            `json:"ok"`
	Errors  map[string]uint64 `json:"errors"`
	Example string            `json:"error_example,omitempty"`
	Seconds float64           `json:"seconds"`
	PerS    float64           `json:"per_s"`
}

func run(ctx context.Context, o options) (*report, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rep := &report{ListenURL: o.listenURL, AnswerURL: o.answerURL, CallURL: o.callURL}

	l, err := startListener(ctx, o)
	if err != nil {
		return nil, err
	}
	defer l.close()
	rep.ListenID = l.id
	progress("listening as %s on %s, answering on %s", l.id, o.listenURL, o.answerURL)

	callTr := newTransport(o.concurrency)
	defer callTr.CloseIdleConnections()
	if err := waitListed(ctx, o, callTr); err != nil {
		return nil, err
	}
	progress("%s listed on %s", listed, o.callURL)

	phase := func(name string, conc, sessions int, warmup, duration time.Duration) (*bench.Result, error) {
		progress("%s: %d in flight for %v", name, conc, duration)
		if warmup <= 0 {
			warmup = -1 // bench.Options: zero is the default, negative none
		}
		r, err := bench.Run(ctx, bench.Options{URL: o.callURL, Token: o.callToken, Tool: listed,
			Concurrency: conc, Sessions: sessions, Warmup: warmup, Duration: duration,
			Progress: os.Stderr, Transport: callTr})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return r, nil
	}
	// The warm-up fills the connection pools and the gateways' own.
	if o.warmup > 0 {
		if _, err := phase("warm-up", o.concurrency, o.sessions, -1, o.warmup); err != nil {
			return nil, err
		}
	}
	settle := func() ([]snapshot, error) {
		callTr.CloseIdleConnections()
		l.answerTr.CloseIdleConnections()
		return snapshots(ctx, o.debug)
	}
	before, err := settle()
	if err != nil {
		return nil, err
	}
	progress("%d relayed calls, %d in flight", o.calls, o.concurrency)
	rep.Relay, err = relayCalls(ctx, o, callTr)
	if err != nil {
		return nil, err
	}
	after, err := settle()
	if err != nil {
		return nil, err
	}
	for i, g := range o.debug {
		rep.Gateways = append(rep.Gateways, gatewayRun{Name: g.name, Before: before[i], After: after[i]})
	}
	if o.settle > 0 {
		progress("waiting %v (-settle)", o.settle)
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(o.settle):
		}
		settled, err := settle()
		if err != nil {
			return rep, err
		}
		for i := range rep.Gateways {
			rep.Gateways[i].Settled = &settled[i]
		}
	}

	if rep.C1, err = phase("latency", 1, 1, o.warmup, o.duration); err != nil {
		return rep, err
	}
	profiles := profile(ctx, o)
	rep.CN, err = phase("throughput", o.concurrency, o.sessions, o.warmup, o.duration)
	rep.Profiles = profiles()
	rep.Listener = l.settledStats(ctx)
	if err != nil {
		return rep, err
	}
	if n := rep.Relay.Calls - int(rep.Relay.OK); n > 0 {
		return rep, fmt.Errorf("%d of %d relayed calls failed (%s)", n, rep.Relay.Calls, rep.Relay.Example)
	}
	return rep, nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "relaybench: "+format+"\n", args...)
}

// newTransport is an HTTP transport that keeps a connection for each
// call in flight.
func newTransport(conc int) *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2*conc + 16,
		MaxIdleConnsPerHost: 2*conc + 16,
		IdleConnTimeout:     90 * time.Second,
	}
}

func connect(ctx context.Context, c *sdk.Client, url, token string, tr http.RoundTripper) (*sdk.ClientSession, error) {
	s, err := c.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: tr}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect MCP session to %s: %w", url, err)
	}
	return s, nil
}

// event is one event pushed on the listen call.
type event struct {
	Type      string          `json:"type"`
	ListenID  string          `json:"listen_id"`
	RequestID string          `json:"request_id"`
	Arguments json.RawMessage `json:"arguments"`
}

// listener holds the listen and answers its requests; close ends both.
type listener struct {
	id       string
	answerTr *http.Transport
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	requests, answered atomic.Uint64
	mu                 sync.Mutex
	refused            map[string]uint64
	ended              atomic.Pointer[string] // why the listen call returned, if it did
}

// listenerStats are the listener's counts.
type listenerStats struct {
	Requests uint64            `json:"requests"`
	Answered uint64            `json:"answered"`
	Refused  map[string]uint64 `json:"refused,omitempty"`
	Ended    string            `json:"ended,omitempty"`
}

func (l *listener) stats() listenerStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := listenerStats{Requests: l.requests.Load(), Answered: l.answered.Load(), Refused: map[string]uint64{}}
	for k, n := range l.refused {
		st.Refused[k] = n
	}
	if e := l.ended.Load(); e != nil {
		st.Ended = *e
	}
	return st
}

// settledStats are the stats once every request pushed has had its
// answer acknowledged (a caller's call can end before its answerer reads
// the acknowledgement), or after 2s.
func (l *listener) settledStats(ctx context.Context) listenerStats {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		st := l.stats()
		var refused uint64
		for _, n := range st.Refused {
			refused += n
		}
		if st.Answered+refused >= st.Requests || st.Ended != "" {
			return st
		}
		select {
		case <-ctx.Done():
			return st
		case <-time.After(10 * time.Millisecond):
		}
	}
	return l.stats()
}

func (l *listener) close() {
	l.cancel()
	l.wg.Wait()
	l.answerTr.CloseIdleConnections()
}

// startListener opens the listen and returns once it is ready; answers
// go out from -concurrency goroutines, so that a relayed call waits for no
// other.
func startListener(ctx context.Context, o options) (*listener, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &listener{answerTr: newTransport(o.concurrency), cancel: cancel, refused: map[string]uint64{}}
	ok := false
	defer func() {
		if !ok {
			l.close()
		}
	}()
	requests := make(chan event, 1024)
	ready := make(chan string, 1)
	// The SDK hands notifications over one at a time, in order: the
	// handler only passes them on.
	c := sdk.NewClient(&sdk.Implementation{Name: "relaybench-listener", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			var ev event
			if json.Unmarshal([]byte(req.Params.Message), &ev) != nil {
				return
			}
			switch ev.Type {
			case "caller_tools_ready":
				select {
				case ready <- ev.ListenID:
				default:
				}
			case "caller_tool_request":
				l.requests.Add(1)
				select {
				case requests <- ev:
				case <-ctx.Done():
				}
			}
		},
	})
	listenTr := newTransport(1)
	ls, err := connect(ctx, c, o.listenURL, o.listenToken, listenTr)
	if err != nil {
		return nil, err
	}
	ended := make(chan struct{})
	l.wg.Go(func() {
		defer close(ended)
		defer listenTr.CloseIdleConnections()
		defer ls.Close()
		res, err := ls.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerListen, Arguments: json.RawMessage(decl),
			Meta: sdk.Meta{"progressToken": "relaybench"}})
		why := "the listen call returned"
		switch {
		case err != nil:
			why = "the listen call failed: " + err.Error()
		case res.IsError:
			why = "the listen was refused: " + text(res)
		}
		l.ended.Store(&why)
	})
	as, err := connect(ctx, c, o.answerURL, o.listenToken, l.answerTr)
	if err != nil {
		return nil, err
	}
	l.wg.Go(func() {
		<-ctx.Done()
		_ = as.Close()
	})
	select {
	case l.id = <-ready:
	case <-ended:
		return nil, errors.New(*l.ended.Load())
	case <-time.After(10 * time.Second):
		return nil, errors.New("the listen was not ready within 10s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	for range o.concurrency {
		l.wg.Go(func() {
			for {
				select {
				case ev := <-requests:
					l.answer(ctx, as, ev)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	ok = true
	return l, nil
}

// answer completes one request with its arguments as the result.
func (l *listener) answer(ctx context.Context, s *sdk.ClientSession, ev event) {
	args, _ := json.Marshal(map[string]any{"listen_id": l.id, "request_id": ev.RequestID, "result": ev.Arguments})
	res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: mcp.ToolCallerResponse, Arguments: json.RawMessage(args)})
	code := ""
	switch {
	case err != nil && ctx.Err() != nil:
		return
	case err != nil:
		code = "transport"
	case res.IsError:
		code = errorCode(res)
	default:
		l.answered.Add(1)
		return
	}
	l.mu.Lock()
	l.refused[code]++
	l.mu.Unlock()
}

// text is a result's first text content.
func text(res *sdk.CallToolResult) string {
	for _, c := range res.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			return t.Text
		}
	}
	return ""
}

// errorCode is the code of okso's error envelope in a failed result.
func errorCode(res *sdk.CallToolResult) string {
	var env struct{ Code string }
	if json.Unmarshal([]byte(text(res)), &env) == nil && env.Code != "" {
		return env.Code
	}
	return "isError"
}

// waitListed waits until the caller's replica lists the listener's tool:
// the declaration reaches it through KV okso_callers.
func waitListed(ctx context.Context, o options, tr http.RoundTripper) error {
	c := sdk.NewClient(&sdk.Implementation{Name: "relaybench-caller", Version: "1"}, nil)
	s, err := connect(ctx, c, o.callURL, o.callToken, tr)
	if err != nil {
		return err
	}
	defer s.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for t, err := range s.Tools(ctx, nil) {
			if err != nil {
				return fmt.Errorf("list tools at %s: %w", o.callURL, err)
			}
			if t.Name == listed {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never listed %s", o.callURL, listed)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// relayCalls makes o.calls relayed calls at o.concurrency in flight,
// each with its own message, and checks that each result is its own.
func relayCalls(ctx context.Context, o options, tr http.RoundTripper) (*relayResult, error) {
	c := sdk.NewClient(&sdk.Implementation{Name: "relaybench-caller", Version: "1"}, nil)
	sessions := make([]*sdk.ClientSession, min(o.sessions, o.concurrency))
	for i := range sessions {
		s, err := connect(ctx, c, o.callURL, o.callToken, tr)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		sessions[i] = s
	}
	var (
		next, ok atomic.Uint64
		mu       sync.Mutex
		errs     = map[string]uint64{}
		example  string
		wg       sync.WaitGroup
		start    = time.Now()
	)
	fail := func(code, msg string) {
		mu.Lock()
		defer mu.Unlock()
		if errs[code] == 0 && example == "" {
			example = code + ": " + msg
		}
		errs[code]++
	}
	done := make(chan struct{})
	go func() { // progress, as okso bench prints it
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := next.Load()
				fmt.Fprintf(os.Stderr, "%9d done  %8.0f/s\n", min(n, uint64(o.calls)), float64(n)/time.Since(start).Seconds())
			}
		}
	}()
	for w := range o.concurrency {
		s := sessions[w%len(sessions)]
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > uint64(o.calls) {
					return
				}
				msg := strconv.FormatUint(i, 10)
				res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: listed, Arguments: map[string]string{"message": msg}})
				switch {
				case err != nil:
					fail("transport", err.Error())
				case res.IsError:
					fail(errorCode(res), text(res))
				default:
					var got struct{ Message string }
					b, _ := json.Marshal(res.StructuredContent)
					if json.Unmarshal(b, &got) != nil || got.Message != msg {
						fail("wrong_result", fmt.Sprintf("call %s got %s", msg, b))
						continue
					}
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(done)
	secs := time.Since(start).Seconds()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return &relayResult{Calls: o.calls, OK: ok.Load(), Errors: errs, Example: example,
		Seconds: secs, PerS: float64(o.calls) / secs}, nil
}

// snapshots reads each gateway's goroutines and heap once its goroutine
// count has settled (connections the clients closed take a moment to
// end on the server).
func snapshots(ctx context.Context, gws []gateway) ([]snapshot, error) {
	out := make([]snapshot, len(gws))
	for i, g := range gws {
		last, same := -1, 0
		for deadline := time.Now().Add(5 * time.Second); same < 3 && time.Now().Before(deadline); {
			n, err := goroutines(ctx, g.url)
			if err != nil {
				return nil, err
			}
			if n == last {
				same++
			} else {
				last, same = n, 1
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		s, err := heap(ctx, g.url)
		if err != nil {
			return nil, err
		}
		// Counted after the GC the heap profile ran.
		if s.Goroutines, err = goroutines(ctx, g.url); err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

func get(ctx context.Context, url string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("get %s: %s", url, resp.Status)
	}
	return resp.Body, nil
}

// goroutines is the count on the first line of the goroutine profile,
// "goroutine profile: total N".
func goroutines(ctx context.Context, base string) (int, error) {
	body, err := get(ctx, base+"/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	defer body.Close()
	line, _ := bufio.NewReader(body).ReadString('\n')
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "goroutine profile: total ")))
	if err != nil {
		return 0, fmt.Errorf("goroutine profile of %s begins %q", base, line)
	}
	return n, nil
}

// heap reads runtime.MemStats from the heap profile, after a GC (gc=1).
func heap(ctx context.Context, base string) (snapshot, error) {
	var s snapshot
	body, err := get(ctx, base+"/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		return s, err
	}
	defer body.Close()
	fields := map[string]*uint64{"HeapInuse": &s.HeapInuse, "HeapAlloc": &s.HeapAlloc, "HeapObjects": &s.HeapObjects}
	found := 0
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "# "), " = ")
		if p := fields[k]; ok && p != nil {
			if *p, err = strconv.ParseUint(v, 10, 64); err == nil {
				found++
			}
		}
	}
	if found != len(fields) {
		return s, fmt.Errorf("heap profile of %s: runtime.MemStats not found", base)
	}
	return s, sc.Err()
}

// profile takes a CPU profile of each gateway, and one of relaybench
// itself, over the measured part of the next timed phase; the function
// it returns waits for them and returns the files written.
func profile(ctx context.Context, o options) func() []string {
	if o.profileDir == "" {
		return func() []string { return nil }
	}
	secs := max(1, int(o.duration.Seconds()))
	files := make([]string, len(o.debug)+1)
	var wg sync.WaitGroup
	wg.Go(func() { // relaybench's own: where the load generator's share goes
		select {
		case <-ctx.Done():
			return
		case <-time.After(o.warmup):
		}
		name := filepath.Join(o.profileDir, "relaybench.cpu.pprof")
		f, err := os.Create(name)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			progress("cpu profile of relaybench: %v", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(secs) * time.Second):
		}
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			progress("cpu profile of relaybench: %v", err)
			return
		}
		files[len(o.debug)] = name
	})
	for i, g := range o.debug {
		wg.Go(func() {
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.warmup):
			}
			body, err := get(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", g.url, secs))
			if err != nil {
				progress("cpu profile of %s: %v", g.name, err)
				return
			}
			defer body.Close()
			name := filepath.Join(o.profileDir, g.name+".cpu.pprof")
			f, err := os.Create(name)
			if err == nil {
				_, err = io.Copy(f, body)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				progress("cpu profile of %s: %v", g.name, err)
				return
			}
			files[i] = name
		})
	}
	return func() []string {
		wg.Wait()
		var out []string
		for _, f := range files {
			if f != "" {
				out = append(out, f)
			}
		}
		return out
	}
}
