// Package testupstream is an MCP server for the tests of okso's remote
// tier: an upstream written with the official Go SDK that echoes what it
// was sent, counts its calls, fails on demand, hangs, dies, and changes
// its tool list while sessions are open. Nothing has to be built for it:
// over HTTP it runs in the test's process, over stdio it is the test
// binary itself, run again.
//
// Over Streamable HTTP:
//
//	u := testupstream.New(testupstream.Options{Flaky: 1})
//	srv := httptest.NewServer(u.Handler())
//	defer srv.Close()
//	// ... dial srv.URL, then u.Calls("flaky")
//
// Over stdio, the package's TestMain runs [Main] first, and a test
// starts the child with [Command]:
//
//	func TestMain(m *testing.M) { testupstream.Main(); os.Exit(m.Run()) }
//
//	argv, env := testupstream.Command(testupstream.Options{State: t.TempDir()})
//	// ... start argv with env, then testupstream.Calls(state, "count")
//
// Its tools:
//   - echo {message}: answers the message as text, and as structured
//     content {message, meta, headers}: the _meta of the call and its
//     X-*, Traceparent and Mcp-Protocol-Version HTTP headers, so that a
//     test sees what reached the upstream;
//   - count {}: answers {count}, how many times it was called;
//   - flaky {}: fails its first Options.Flaky calls (HTTP: 503 before the
//     MCP handler; stdio: the process exits with status 3), then answers
//     {attempt};
//   - reset {}: counts the call and answers nothing (HTTP: the connection
//     is reset; stdio: the process exits with status 4);
//   - hang {ms}: answers only when the call is cancelled, or
//     [Upstream.Release] is called, or, when ms is given, after ms
//     milliseconds with {slept: ms};
//   - add_tool {name}: adds an echo tool named name, which sends
//     notifications/tools/list_changed to every session ([Upstream.AddTool]
//     does the same from the test).
//
// Every call of every tool is counted, in Options.State when it is set
// (so that counts outlive a stdio child and its restarts), in memory
// otherwise.
package testupstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EnvServe, set to "stdio" in a test binary's environment, makes [Main]
// serve the upstream over stdio and exit.
const EnvServe = "OKSO_TESTUPSTREAM"

const (
	envState    = "OKSO_TESTUPSTREAM_STATE"
	envFlaky    = "OKSO_TESTUPSTREAM_FLAKY"
	envPageSize = "OKSO_TESTUPSTREAM_PAGE_SIZE"
)

// Options configure an upstream. The zero value is a well-behaved
// upstream that counts in memory.
type Options struct {
	// State is a directory the upstream counts its calls in (a file per
	// tool), and where a stdio child writes its process id ([PID]).
	// Required over stdio.
	State string
	// Flaky is how many calls of the tool flaky fail before one answers.
	Flaky int
	// Token, over HTTP: a request without "Authorization: Bearer <Token>"
	// is answered 401.
	Token string
	// PageSize is the most tools in one page of tools/list (the SDK's
	// default when zero).
	PageSize int
}

// Upstream is the test upstream. Its methods are safe for concurrent use.
type Upstream struct {
	o     Options
	srv   *mcp.Server
	stdio bool // a child serving stdio: flaky and reset exit

	mu       sync.Mutex
	counts   map[string]int // when o.State is ""
	released chan struct{}  // closed by Release
	release  sync.Once
}

// New returns an upstream with its tools.
func New(o Options) *Upstream {
	u := &Upstream{o: o, counts: map[string]int{}, released: make(chan struct{})}
	u.srv = mcp.NewServer(&mcp.Implementation{Name: "testupstream", Version: "1"}, &mcp.ServerOptions{PageSize: o.PageSize})
	u.AddTool("echo")
	u.add("count", "How many times it was called.", `{"type":"object"}`, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return structured(map[string]any{"count": u.count("count")})
	})
	u.add("flaky", "Fails its first calls, then answers.", `{"type":"object"}`, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var n int
		if req.Extra != nil && req.Extra.Header != nil {
			n = u.Calls("flaky") // counted, and passed, by Handler
		} else if n = u.count("flaky"); n <= u.o.Flaky {
			if u.stdio {
				os.Exit(3)
			}
			return nil, fmt.Errorf("flaky: failure %d of %d", n, u.o.Flaky)
		}
		return structured(map[string]any{"attempt": n})
	})
	u.add("reset", "Counts the call and never answers it.", `{"type":"object"}`, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.count("reset")
		if u.stdio {
			os.Exit(4)
		}
		return nil, errors.New("reset: only over HTTP or stdio")
	})
	u.add("hang", "Answers only when cancelled.", `{"type":"object"}`, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.count("hang")
		var args struct{ MS int }
		_ = json.Unmarshal(req.Params.Arguments, &args)
		var slept <-chan time.Time
		if args.MS > 0 {
			slept = time.After(time.Duration(args.MS) * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-u.released:
			return nil, errors.New("hang: released")
		case <-slept:
			return structured(map[string]any{"slept": args.MS})
		}
	})
	u.add("add_tool", "Adds an echo tool of the given name.",
		`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`,
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.count("add_tool")
			var args struct{ Name string }
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil || args.Name == "" {
				return nil, errors.New("add_tool: a name is required")
			}
			u.AddTool(args.Name)
			return structured(map[string]any{"added": args.Name})
		})
	return u
}

// Server is the upstream's MCP server.
func (u *Upstream) Server() *mcp.Server { return u.srv }

// AddTool adds (or replaces) an echo tool named name; the SDK tells every
// open session that the tool list changed.
func (u *Upstream) AddTool(name string) {
	u.add(name, "Echoes the message, with what reached the upstream.",
		`{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`,
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.count(name)
			var args struct{ Message string }
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, err
			}
			headers := map[string]string{}
			if req.Extra != nil {
				for k, v := range req.Extra.Header {
					if strings.HasPrefix(k, "X-") || k == "Traceparent" || k == "Mcp-Protocol-Version" {
						headers[k] = strings.Join(v, ",")
					}
				}
			}
			meta := map[string]any{}
			for k, v := range req.Params.Meta {
				if !strings.HasPrefix(k, "io.modelcontextprotocol/") { // the SDK's own
					meta[k] = v
				}
			}
			res, err := structured(map[string]any{"message": args.Message, "meta": meta, "headers": headers})
			if err == nil {
				res.Content = []mcp.Content{&mcp.TextContent{Text: args.Message}}
			}
			return res, err
		})
}

// EndSessions ends every session of the upstream, as an upstream that
// restarted would have: over HTTP the next request of a session gets 404.
func (u *Upstream) EndSessions() {
	for ss := range u.srv.Sessions() {
		_ = ss.Close()
	}
}

// Release ends every call of hang, now and later. The go-sdk server
// waits for its calls before it ends a session, so a test that leaves a
// hang unanswered over HTTP releases it before it closes the server.
func (u *Upstream) Release() { u.release.Do(func() { close(u.released) }) }

// RemoveTool removes the tool named name; the SDK tells every open
// session that the tool list changed.
func (u *Upstream) RemoveTool(name string) { u.srv.RemoveTools(name) }

func (u *Upstream) add(name, desc, schema string, h mcp.ToolHandler) {
	u.srv.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: json.RawMessage(schema)}, h)
}

func structured(v any) (*mcp.CallToolResult, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil
}

// Handler serves the upstream over Streamable HTTP (stateful). It
// answers 401 to a request without the token, 503 to the first
// Options.Flaky calls of flaky, and resets the connection of every call
// of reset, before the MCP handler sees them.
func (u *Upstream) Handler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.srv }, nil)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u.o.Token != "" && r.Header.Get("Authorization") != "Bearer "+u.o.Token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			body, ok := peekBody(w, r)
			if !ok {
				return
			}
			var msg struct {
				Method string `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
				switch msg.Params.Name {
				case "flaky":
					if n := u.count("flaky"); n <= u.o.Flaky {
						http.Error(w, "try again", http.StatusServiceUnavailable)
						return
					}
				case "reset":
					u.count("reset")
					reset(w)
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// StatelessHandler serves the upstream over Streamable HTTP, stateless:
// each request on its own, in the revision it declares, 2026-07-28 (the
// SDK client's choice) among them. As the SDK serves that revision it
// refuses a ping: 400 and -32602 without the revision's _meta, 404 and
// -32601 with it. It adds none of Handler's HTTP failures (Token, flaky,
// reset): echo, count and hang are its tools to call.
func (u *Upstream) StatelessHandler() http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.srv },
		&mcp.StreamableHTTPOptions{Stateless: true})
}

// ModernHandler serves the upstream as a server of 2026-07-28 alone
// would: stateless, and refusing a request of an older revision (an
// initialize, or one whose Mcp-Protocol-Version is older) with 404 and
// -32601 and 400 and -32602, so that a client comes in by that
// revision's server/discover.
func (u *Upstream) ModernHandler() http.Handler {
	h := u.StatelessHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, ok := peekBody(w, r)
		if !ok {
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		if len(msg.ID) == 0 {
			msg.ID = json.RawMessage("null")
		}
		refuse := func(status, code int, message string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q}}`, msg.ID, code, message)
		}
		switch v := r.Header.Get("Mcp-Protocol-Version"); {
		case msg.Method == "initialize":
			refuse(http.StatusNotFound, -32601, `method not found: "initialize"`)
		case v != "" && v < "2026-07-28":
			refuse(http.StatusBadRequest, -32602, "unsupported protocol version "+v)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// reset closes the request's connection with a TCP reset.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(fmt.Sprintf("testupstream: reset: %v", err))
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

// count counts a call of tool and returns the count so far.
func (u *Upstream) count(tool string) int {
	if u.o.State == "" {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.counts[tool]++
		return u.counts[tool]
	}
	f, err := os.OpenFile(countFile(u.o.State, tool), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		panic(fmt.Sprintf("testupstream: count: %v", err))
	}
	defer f.Close()
	if _, err := f.Write([]byte{'.'}); err != nil {
		panic(fmt.Sprintf("testupstream: count: %v", err))
	}
	return Calls(u.o.State, tool)
}

// Calls is how many times tool was called.
func (u *Upstream) Calls(tool string) int {
	if u.o.State != "" {
		return Calls(u.o.State, tool)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.counts[tool]
}

// Calls is how many times tool was called by the upstreams counting in
// the directory state: stdio children, whatever their restarts.
func Calls(state, tool string) int {
	fi, err := os.Stat(countFile(state, tool))
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

func countFile(state, tool string) string { return filepath.Join(state, "calls."+tool) }

// PID is the process id of the last stdio child started with state.
func PID(state string) (int, error) {
	b, err := os.ReadFile(filepath.Join(state, "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(b))
}

// Command is the argv and environment of a stdio child: the running
// (test) binary, whose TestMain calls [Main]. o.State is required.
func Command(o Options) (argv []string, env map[string]string) {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return []string{exe}, map[string]string{
		// A test binary built with -race sleeps a second before it exits.
		"GORACE":    "atexit_sleep_ms=0",
		EnvServe:    "stdio",
		envState:    o.State,
		envFlaky:    strconv.Itoa(o.Flaky),
		envPageSize: strconv.Itoa(o.PageSize),
	}
}

// Main serves the upstream over stdio and exits, when [EnvServe] says
// so; otherwise it returns at once. Call it first in TestMain.
func Main() {
	if os.Getenv(EnvServe) != "stdio" {
		return
	}
	flaky, _ := strconv.Atoi(os.Getenv(envFlaky))
	pageSize, _ := strconv.Atoi(os.Getenv(envPageSize))
	u := New(Options{State: os.Getenv(envState), Flaky: flaky, PageSize: pageSize})
	u.stdio = true
	if u.o.State != "" {
		pid := filepath.Join(u.o.State, "pid")
		if err := os.WriteFile(pid+".new", []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "testupstream:", err)
			os.Exit(1)
		}
		if err := os.Rename(pid+".new", pid); err != nil {
			fmt.Fprintln(os.Stderr, "testupstream:", err)
			os.Exit(1)
		}
	}
	fmt.Fprintln(os.Stderr, "testupstream: serving stdio")
	if err := u.srv.Run(context.Background(), &mcp.StdioTransport{}); err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "testupstream:", err)
	}
	os.Exit(0)
}

// peekBody reads a request's body (up to 1 MiB) and puts it back for the
// MCP handler; it answers 400 and reports false when it cannot.
func peekBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}
