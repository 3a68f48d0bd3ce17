// Command scalecheck is the MCP half of scripts/scale.sh (make scale), a
// tool and not part of okso: it connects to a gateway with the official Go
// SDK client, lists every tool following pagination (timing each page and
// the whole list), waits until the list holds the expected number of echo
// tools, then calls sysecho.<node>.echo.invoke on every node with bounded
// concurrency and checks each answer's node_id.
//
// It prints a human-readable report on stdout and, with -out, writes the
// figures as key=value lines for the script's summary table. It exits 1
// when the list never became complete or any call failed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/scripts/results"
)

type listing struct {
	pages    []time.Duration
	total    time.Duration
	tools    int
	echo     []string // echo tool names
	other    map[string]int
	failPage int
	err      error
}

func main() {
	var (
		url         = flag.String("url", "", "gateway MCP endpoint, http://127.0.0.1:PORT/mcp")
		token       = flag.String("token", "", "agent bearer token")
		tokenFile   = flag.String("token-file", "", "file holding the agent token (instead of -token)")
		want        = flag.Int("n", 0, "expected number of nodes (echo tools)")
		concurrency = flag.Int("concurrency", 64, "calls in flight at once")
		waitList    = flag.Duration("wait-list", 3*time.Minute, "how long to wait for the list to hold -n echo tools")
		callTimeout = flag.Duration("call-timeout", 30*time.Second, "client-side bound of one call")
		deadline    = flag.Duration("deadline", 10*time.Minute, "bound of the whole run")
		message     = flag.String("message", "scale", "echo message")
		out         = flag.String("out", "", "write key=value results here")
	)
	flag.Parse()
	if *url == "" || (*token == "" && *tokenFile == "") || *want < 1 {
		fmt.Fprintln(os.Stderr, "usage: scalecheck -url URL (-token T | -token-file F) -n N [-concurrency 64]")
		os.Exit(2)
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fatal(err)
		}
		*token = strings.TrimSpace(string(b))
	}
	res := map[string]string{}
	ok := run(res, *url, *token, *want, *concurrency, *waitList, *callTimeout, *deadline, *message)
	if *out != "" {
		if err := results.Write(*out, res); err != nil {
			fatal(err)
		}
	}
	if !ok {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "scalecheck:", err)
	os.Exit(2)
}

func run(res map[string]string, url, token string, want, concurrency int,
	waitList, callTimeout, deadline time.Duration, message string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()

	// Enough idle connections for the call concurrency, so that calls reuse
	// connections instead of burning through ephemeral ports.
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4 * concurrency,
		MaxIdleConnsPerHost: 4 * concurrency,
		IdleConnTimeout:     90 * time.Second,
	}
	defer tr.CloseIdleConnections()
	client := mcp.NewClient(&mcp.Implementation{Name: "okso-scalecheck", Version: "1"}, nil)
	connect := func() (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint:   url,
			HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: tr}},
			MaxRetries: -1,
		}, nil)
	}
	connStart := time.Now()
	s, err := connect()
	if err != nil {
		fmt.Printf("connect %s: %v\n", url, err)
		res["error"] = quote("connect: " + err.Error())
		return false
	}
	defer s.Close()
	// The first request of a token's view may be slow: the gateway can build
	// that view's tool list then.
	res["mcp_connect"] = time.Since(connStart).Round(time.Millisecond).String()
	fmt.Printf("MCP session up in %v (protocol %s)\n", res["mcp_connect"], s.InitializeResult().ProtocolVersion)

	// List until the gateway knows every node (it may trail the fleet's
	// "connected" line while the registry watch catches up).
	waitStart := time.Now()
	var l listing
	attempts := 0
	for {
		attempts++
		l = list(ctx, s)
		if l.err != nil {
			fmt.Printf("list attempt %d: page %d failed: %v\n", attempts, l.failPage, l.err)
		} else {
			fmt.Printf("list attempt %d: %d tools (%d echo) in %d pages, %v\n", attempts, l.tools, len(l.echo),
				len(l.pages), l.total.Round(time.Millisecond))
		}
		if l.err == nil && len(l.echo) >= want {
			break
		}
		if time.Since(waitStart) > waitList || ctx.Err() != nil {
			break
		}
		time.Sleep(2 * time.Second)
	}
	res["list_attempts"] = fmt.Sprint(attempts)
	res["list_ready_after"] = time.Since(waitStart).Round(time.Millisecond).String()
	res["list_tools"] = fmt.Sprint(l.tools)
	res["list_echo"] = fmt.Sprint(len(l.echo))
	res["list_pages"] = fmt.Sprint(len(l.pages))
	res["list_total"] = l.total.Round(time.Millisecond).String()
	if len(l.pages) > 0 {
		sorted := slices.Sorted(slices.Values(l.pages))
		var sum time.Duration
		for _, p := range l.pages {
			sum += p
		}
		res["list_page_mean"] = (sum / time.Duration(len(l.pages))).Round(time.Millisecond).String()
		res["list_page_max"] = sorted[len(sorted)-1].Round(time.Millisecond).String()
		res["list_page_first"] = l.pages[0].Round(time.Millisecond).String()
		fmt.Printf("list pages: first %v, mean %v, max %v (%d pages)\n", res["list_page_first"],
			res["list_page_mean"], res["list_page_max"], len(l.pages))
	}
	for k, v := range l.other {
		fmt.Printf("  %d tools of prefix %q\n", v, k)
	}
	if l.err != nil {
		res["error"] = quote("list: " + l.err.Error())
	}
	listOK := l.err == nil && len(l.echo) == want
	if !listOK {
		fmt.Printf("LIST INCOMPLETE: %d echo tools, want %d\n", len(l.echo), want)
	}
	if len(l.echo) == 0 {
		return false
	}

	// Call echo on every node, from a session of its own: the go-sdk client
	// (v1.8.0) looks each called tool up in the lists its session cached,
	// one by one, which at 200,000 listed tools cost the client more than
	// okso took to answer.
	s, err = connect()
	if err != nil {
		fmt.Printf("connect %s: %v\n", url, err)
		res["error"] = quote("connect: " + err.Error())
		return false
	}
	defer s.Close()
	type outcome struct {
		lat  time.Duration
		code string // "" when ok
	}
	outcomes := make([]outcome, len(l.echo))
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		examples = map[string]string{}
	)
	callStart := time.Now()
	for range concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(l.echo) {
					return
				}
				name := l.echo[i]
				cctx, ccancel := context.WithTimeout(ctx, callTimeout)
				t0 := time.Now()
				r, err := s.CallTool(cctx, &mcp.CallToolParams{Name: name,
					Arguments: map[string]any{"message": message}})
				lat := time.Since(t0)
				ccancel()
				code, detail := classify(name, message, r, err)
				outcomes[i] = outcome{lat, code}
				if code != "" {
					mu.Lock()
					if _, seen := examples[code]; !seen {
						examples[code] = name + ": " + detail
					}
					mu.Unlock()
				}
			}
		})
	}
	// Progress while calling.
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := min(int(next.Load()), len(l.echo))
				fmt.Printf("calls started %d/%d after %v\n", n, len(l.echo), time.Since(callStart).Round(time.Second))
			}
		}
	}()
	wg.Wait()
	close(done)
	wall := time.Since(callStart)

	lats := make([]time.Duration, 0, len(outcomes))
	byCode := map[string]int{}
	okN := 0
	for _, o := range outcomes {
		lats = append(lats, o.lat)
		if o.code == "" {
			okN++
		} else {
			byCode[o.code]++
		}
	}
	slices.Sort(lats)
	pct := func(p float64) time.Duration {
		if len(lats) == 0 {
			return 0
		}
		i := int(p*float64(len(lats))+0.5) - 1
		return lats[max(0, min(i, len(lats)-1))]
	}
	failed := len(outcomes) - okN
	res["calls"] = fmt.Sprint(len(outcomes))
	res["calls_ok"] = fmt.Sprint(okN)
	res["calls_failed"] = fmt.Sprint(failed)
	codes := make([]string, 0, len(byCode))
	for c, n := range byCode {
		codes = append(codes, fmt.Sprintf("%s:%d", c, n))
	}
	sort.Strings(codes)
	res["calls_failed_by_code"] = quote(strings.Join(codes, ","))
	res["calls_wall"] = wall.Round(time.Millisecond).String()
	res["calls_per_s"] = fmt.Sprintf("%.0f", float64(len(outcomes))/wall.Seconds())
	res["call_p50"] = pct(0.50).Round(100 * time.Microsecond).String()
	res["call_p99"] = pct(0.99).Round(100 * time.Microsecond).String()
	res["call_max"] = pct(1).Round(100 * time.Microsecond).String()
	res["concurrency"] = fmt.Sprint(concurrency)
	fmt.Printf("calls: %d ok, %d failed %v, in %v = %s calls/s; latency p50 %s p99 %s max %s (concurrency %d)\n",
		okN, failed, codes, wall.Round(time.Millisecond), res["calls_per_s"], res["call_p50"], res["call_p99"],
		res["call_max"], concurrency)
	for c, ex := range examples {
		fmt.Printf("  first %s: %s\n", c, ex)
	}
	return listOK && failed == 0
}

// list walks every page of tools/list, timing each.
func list(ctx context.Context, s *mcp.ClientSession) listing {
	l := listing{other: map[string]int{}}
	params := &mcp.ListToolsParams{}
	start := time.Now()
	for {
		t0 := time.Now()
		r, err := s.ListTools(ctx, params)
		l.pages = append(l.pages, time.Since(t0))
		if err != nil {
			l.err, l.failPage = err, len(l.pages)
			break
		}
		for _, t := range r.Tools {
			l.tools++
			// Either form of listed names (okso's safe default, or seed).
			if dashed := strings.ReplaceAll(t.Name, ".", "-"); strings.HasPrefix(dashed, "sysecho-") && strings.HasSuffix(dashed, "-echo-invoke") {
				l.echo = append(l.echo, t.Name)
			} else {
				prefix, _, _ := strings.Cut(dashed, "-")
				l.other[prefix]++
			}
		}
		if r.NextCursor == "" {
			break
		}
		params = &mcp.ListToolsParams{Cursor: r.NextCursor}
	}
	l.total = time.Since(start)
	return l
}

// classify returns "" for a good answer, else an error code and a detail.
func classify(name, message string, r *mcp.CallToolResult, err error) (string, string) {
	if err != nil {
		var we *jsonrpc.Error
		if errors.As(err, &we) {
			code := fmt.Sprintf("jsonrpc%d", we.Code)
			var env struct {
				Code string `json:"code"`
			}
			if json.Unmarshal(we.Data, &env) == nil && env.Code != "" {
				code += "/" + env.Code
			}
			return code, err.Error()
		}
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return "client_timeout", err.Error()
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return "transport_eof", err.Error()
		}
		return "transport", err.Error()
	}
	b, _ := json.Marshal(r.StructuredContent)
	if r.IsError {
		var env struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(b, &env) != nil || env.Code == "" {
			// Maybe only in the text content.
			for _, c := range r.Content {
				if tc, ok := c.(*mcp.TextContent); ok && json.Unmarshal([]byte(tc.Text), &env) == nil && env.Code != "" {
					break
				}
			}
		}
		if env.Code == "" {
			env.Code = "isError_without_code"
		}
		return env.Code, string(b)
	}
	var out struct {
		Message string `json:"message"`
		NodeID  string `json:"node_id"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return "bad_result", string(b)
	}
	// Either listed form: a node id has neither '.' nor '-'.
	parts := strings.Split(strings.ReplaceAll(name, ".", "-"), "-")
	if len(parts) != 4 || out.NodeID != parts[1] {
		return "wrong_node_id", string(b)
	}
	if out.Message != message {
		return "wrong_message", string(b)
	}
	return "", ""
}

func quote(s string) string {
	return strings.ReplaceAll(s, "\n", " ")
}
