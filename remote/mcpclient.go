package remote

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/okso-io/okso/internal/child"
	"github.com/okso-io/okso/internal/rawio"
	"github.com/okso-io/okso/schemas"
)

// StdioOptions configure [DialStdio].
type StdioOptions struct {
	// Command is the upstream's argv; Command[0] is looked up in the
	// tier's PATH unless it holds a slash.
	Command []string
	// Env is the process's whole environment besides the tier's PATH and
	// HOME (which Env may override): nothing else of the tier's leaks.
	Env map[string]string
	// Log gets the process's stderr, a line each, bounded. Nil: discarded.
	Log *slog.Logger
	// Dir is the process's working directory; empty: the tier's.
	Dir string
}

// HTTPOptions configure [DialHTTP].
type HTTPOptions struct {
	// URL is the upstream's MCP endpoint.
	URL string
	// Headers are sent with every request (an Authorization header, say).
	Headers map[string]string
	// Client makes the requests; nil: a client of its own. Its Timeout is
	// not used (a session holds a stream open): each call is bounded by
	// its context.
	Client *http.Client
	// Log gets what the MCP client has to say. Nil: discarded.
	Log *slog.Logger
}

// maxListPages bounds the pages of one List, against an upstream whose
// cursors never end.
const maxListPages = 1000

// sessionExit bounds how long a failed stdio call waits to learn whether
// the process is gone: when it is, its session ended at most this long
// before (normally microseconds).
const sessionExit = time.Second

// mcpClient is a [Client] over an MCP session, stdio or HTTP.
type mcpClient struct {
	cs      *mcp.ClientSession
	proc    *child.Proc // stdio only
	http    *httpCaller // http only
	changed chan struct{}
	// done is closed once the session has ended and, for stdio, the
	// process with it.
	done      chan struct{}
	closeIdle func() // http, with a transport of its own
	closeOnce sync.Once
	closeErr  error

	// The requests under way, which Close cancels and waits for before it
	// closes the session: the SDK's Close would wait for them, and a
	// cancelled request tells the upstream to stop.
	mu       sync.Mutex
	closing  atomic.Bool // set under mu
	inflight map[uint64]context.CancelFunc
	next     uint64
	running  sync.WaitGroup
}

func newMCPClient() *mcpClient {
	return &mcpClient{changed: make(chan struct{}, 1), done: make(chan struct{}), inflight: map[uint64]context.CancelFunc{}}
}

// begin registers a request under way, with a context that Close
// cancels; end unregisters it.
func (c *mcpClient) begin(ctx context.Context) (_ context.Context, end func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing.Load() {
		cancel()
		return nil, nil, mcp.ErrConnectionClosed
	}
	id := c.next
	c.next++
	c.inflight[id] = cancel
	c.running.Add(1)
	return ctx, func() {
		c.mu.Lock()
		delete(c.inflight, id)
		c.mu.Unlock()
		cancel()
		c.running.Done()
	}, nil
}

func newSDKClient(changed chan struct{}, log *slog.Logger) *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "okso-remote", Version: "1"}, &mcp.ClientOptions{
		Logger: log,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default: // one is pending already
			}
		},
	})
}

// DialStdio starts the upstream's process and opens an MCP session to it
// over the process's stdin and stdout. The process leads a process group
// of its own; when it exits, the group is killed and reaped and Done is
// closed, and calls fail with [ErrProcessExited]. Starting it again is
// the caller's (the tier's, with backoff). Close closes stdin, gives the
// process 2 s to exit, then SIGTERMs its group, then SIGKILLs it, and
// returns once every process of the group is gone.
func DialStdio(ctx context.Context, o StdioOptions) (Client, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p, err := child.Start(child.Options{Argv: o.Command, Env: o.Env, Dir: o.Dir, Log: log, LogMessage: "upstream stderr"})
	if err != nil {
		return nil, err
	}
	c := newMCPClient()
	c.proc = p
	sdk := newSDKClient(c.changed, log)
	// Not the SDK's CommandTransport: it waits for the process itself (so
	// a process that died while a child of its holds stdout goes
	// unnoticed), and signals the process alone, never its group.
	cs, err := sdk.Connect(ctx, &mcp.IOTransport{Reader: p.Stdout, Writer: p.Stdin}, nil)
	if err != nil {
		p.Stdin.Close()
		p.Stdout.Close()
		p.Kill()
		if p.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (%v): %w", ErrProcessExited, p.Err(), err)
		}
		return nil, fmt.Errorf("connect to %s: %w", o.Command[0], err)
	}
	c.cs = cs
	go c.watchStdio()
	return c, nil
}

// watchStdio ends the session when the process exits and the process
// when the session ends, then closes done.
func (c *mcpClient) watchStdio() {
	defer close(c.done)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_ = c.cs.Wait()
	}()
	select {
	case <-c.proc.Exited():
		_ = c.cs.Close() // calls in flight fail now
	case <-ended:
		if !c.closing.Load() { // Close ends the process politely itself
			c.proc.Kill()
		}
	}
	<-ended
	<-c.proc.Done()
}

// maxIdleConnsPerUpstream is how many idle connections to an HTTP
// upstream are kept: as many as the calls the tier serves at once.
const maxIdleConnsPerUpstream = 256

// DialHTTP opens an MCP session to a Streamable HTTP upstream. Every
// request carries o.Headers; a call's also carry its request id and
// trace context as X-Request-Id and traceparent. An HTTP error status is
// kept with the error ([HTTPStatusError]) so that [Classify] can tell a
// 401 from a 503. Done is closed when the session ends: the upstream lost
// it, or its event stream could not be reopened.
func DialHTTP(ctx context.Context, o HTTPOptions) (Client, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := newMCPClient()
	hc := &http.Client{}
	if o.Client != nil {
		*hc = *o.Client
	}
	hc.Timeout = 0
	base := hc.Transport
	if base == nil {
		own := http.DefaultTransport.(*http.Transport).Clone()
		// Every call is a POST to one host: keep a connection for each
		// call in flight, not net/http's 2, or most calls dial anew.
		own.MaxIdleConnsPerHost = maxIdleConnsPerUpstream
		own.DialContext = rawio.Dial(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
		base, c.closeIdle = own, own.CloseIdleConnections
	}
	c.http = &httpCaller{url: o.URL, hc: hc, lost: func() { go c.cs.Close() }}
	hc.Transport = &headerTransport{base: base, headers: o.Headers, learn: c.http.learn}
	sdk := newSDKClient(c.changed, log)
	info := &callInfo{}
	cs, err := sdk.Connect(context.WithValue(ctx, callInfoKey{}, info),
		&mcp.StreamableClientTransport{Endpoint: o.URL, HTTPClient: hc}, nil)
	if err != nil {
		if c.closeIdle != nil {
			c.closeIdle()
		}
		return nil, fmt.Errorf("connect to %s: %w", redactURL(o.URL), info.wrap(err))
	}
	c.cs = cs
	go func() {
		defer close(c.done)
		_ = cs.Wait()
	}()
	return c, nil
}

func (c *mcpClient) Changed() <-chan struct{} { return c.changed }
func (c *mcpClient) Done() <-chan struct{}    { return c.done }

func (c *mcpClient) List(ctx context.Context) ([]Tool, error) {
	if err := c.gone(); err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	parent := ctx
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tools: %w", err)
	}
	defer end()
	ctx, info := withCallInfo(ctx, nil)
	var tools []Tool
	params := &mcp.ListToolsParams{}
	for range maxListPages {
		res, err := c.cs.ListTools(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("list tools: %w", c.callErr(parent, info.wrap(err)))
		}
		for _, t := range res.Tools {
			tool, err := toolOf(t)
			if err != nil {
				return nil, fmt.Errorf("list tools: %w", err)
			}
			tools = append(tools, tool)
		}
		if res.NextCursor == "" {
			if c.http != nil {
				c.http.plainCalls(ctx)
			}
			return tools, nil
		}
		params.Cursor = res.NextCursor
	}
	return nil, fmt.Errorf("list tools: more than %d pages", maxListPages)
}

// Ping asks an HTTP upstream whether it is there, and returns nil when
// it answered: any JSON-RPC answer, a result or an error object, carried
// by whatever HTTP status, whatever revision the upstream speaks
// ([httpCaller.ping]). Its error says that the upstream did not answer:
// the request failed or went unanswered within ctx, or what answered was
// not JSON-RPC (a proxy's 502 page). A stdio upstream is not asked: its
// process's exit ends the session at once, and one that serves its
// requests in turn must not be taken for dead while busy.
func (c *mcpClient) Ping(ctx context.Context) error {
	if c.proc != nil {
		return nil
	}
	if err := c.gone(); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	defer end()
	if ok, err := c.http.ping(ctx); ok {
		if err != nil {
			return fmt.Errorf("ping: %w", err)
		}
		return nil
	}
	// Nothing listed yet, so the session's shape is not known: the SDK
	// pings, and since its error cannot tell an answer from a failure,
	// only a result counts.
	if err := c.cs.Ping(ctx, nil); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// toolOf is t as the tier keeps it, its schemas as JSON.
func toolOf(t *mcp.Tool) (Tool, error) {
	out := Tool{Name: t.Name, Title: t.Title, Description: t.Description}
	if out.Title == "" && t.Annotations != nil {
		out.Title = t.Annotations.Title
	}
	var err error
	if out.InputSchema, err = json.Marshal(t.InputSchema); err != nil {
		return Tool{}, fmt.Errorf("tool %q: input schema: %w", t.Name, err)
	}
	if t.OutputSchema != nil {
		if out.OutputSchema, err = json.Marshal(t.OutputSchema); err != nil {
			return Tool{}, fmt.Errorf("tool %q: output schema: %w", t.Name, err)
		}
	}
	return out, nil
}

func (c *mcpClient) Call(ctx context.Context, tool string, args json.RawMessage, meta map[string]any) (json.RawMessage, error) {
	args, err := objectArgs(args)
	if err != nil {
		return nil, fmt.Errorf("call %s: arguments: %w", tool, err)
	}
	if err := c.gone(); err != nil {
		return nil, fmt.Errorf("call %s: %w", tool, err)
	}
	parent := ctx
	ctx, end, err := c.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", tool, err)
	}
	defer end()
	ctx, info := withCallInfo(ctx, meta)
	if c.http != nil {
		res, ok, err := c.http.call(ctx, tool, args, meta)
		if ok {
			if err != nil {
				return nil, fmt.Errorf("call %s: %w", tool, c.callErr(parent, info.wrap(err)))
			}
			return res, nil
		}
	}
	// A map of this call's own: the SDK may write into it.
	m := make(mcp.Meta, len(meta))
	for k, v := range meta {
		m[k] = v
	}
	res, err := c.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: m})
	if err != nil {
		return nil, fmt.Errorf("call %s: %w", tool, c.callErr(parent, info.wrap(err)))
	}
	out, err := json.Marshal(toolResult{Content: res.Content, StructuredContent: res.StructuredContent, IsError: res.IsError})
	if err != nil {
		return nil, fmt.Errorf("call %s: encode result: %w", tool, err)
	}
	return out, nil
}

// toolResult is a CallToolResult as the tier passes it on: its _meta and
// the SDK's bookkeeping dropped.
type toolResult struct {
	Content           []mcp.Content `json:"content"`
	StructuredContent any           `json:"structuredContent,omitempty"`
	IsError           bool          `json:"isError,omitempty"`
}

func (t toolResult) MarshalJSON() ([]byte, error) {
	type plain toolResult
	if t.Content == nil {
		t.Content = []mcp.Content{}
	}
	return json.Marshal(plain(t))
}

// gone returns an error when the session has ended already, so that a
// call fails at once and says why.
func (c *mcpClient) gone() error {
	select {
	case <-c.done:
	default:
		return nil
	}
	if c.proc != nil && !c.closing.Load() {
		return ErrProcessExited
	}
	return mcp.ErrConnectionClosed
}

// callErr is the error of a failed request whose context was ctx: a
// closed connection when Close cancelled it, and, of a stdio request that
// the upstream did not answer with an error of its own, whether the
// process is gone: the session ends with it, and then the request may be
// tried again once it is restarted.
func (c *mcpClient) callErr(ctx context.Context, err error) error {
	if c.closing.Load() && ctx.Err() == nil {
		return mcp.ErrConnectionClosed
	}
	var rpc *jsonrpc.Error
	if c.proc == nil || c.closing.Load() || ctx.Err() != nil || errors.As(err, &rpc) {
		return err
	}
	t := time.NewTimer(sessionExit)
	defer t.Stop()
	select {
	case <-c.done:
		if c.closing.Load() {
			return err
		}
		return fmt.Errorf("%w: %w", ErrProcessExited, err)
	case <-t.C:
	case <-ctx.Done():
	}
	return err
}

// Close ends the session, and for stdio the process and its group; it
// returns once they are gone. For stdio it reports nothing: the process
// ended, one way or another.
func (c *mcpClient) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closing.Store(true)
		for _, cancel := range c.inflight {
			cancel()
		}
		c.mu.Unlock()
		c.running.Wait()
		err := c.cs.Close()
		if c.proc != nil {
			c.proc.Stop()
			err = nil
		}
		<-c.done
		if c.closeIdle != nil {
			c.closeIdle()
		}
		if errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed) {
			err = nil
		}
		c.closeErr = err
	})
	return c.closeErr
}

// callInfo is what a request of one call carries down to headerTransport
// (in its context), and what it brings back.
type callInfo struct {
	requestID, traceparent string
	status                 atomic.Int32 // the last HTTP error status answered, if any
}

type callInfoKey struct{}

// withCallInfo gives ctx a callInfo with the correlation of meta.
func withCallInfo(ctx context.Context, meta map[string]any) (context.Context, *callInfo) {
	info := &callInfo{}
	info.requestID, _ = meta[schemas.MetaRequestID].(string)
	info.traceparent, _ = meta[schemas.MetaTraceparent].(string)
	return context.WithValue(ctx, callInfoKey{}, info), info
}

// wrap keeps the HTTP status that refused the call with its error.
func (i *callInfo) wrap(err error) error {
	if s := i.status.Load(); s != 0 {
		return &HTTPStatusError{Status: int(s), Err: err}
	}
	return err
}

// headerTransport adds the configured headers to every request, and the
// call's correlation to a call's; it records an error status in the
// call's callInfo.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
	// learn sees every request the upstream answered 200, until the
	// session's shape is known ([httpCaller.learn]).
	learn func(*http.Request)
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	info, _ := req.Context().Value(callInfoKey{}).(*callInfo)
	req = req.Clone(req.Context())
	for k, v := range t.headers {
		req.Header.Set(k, v)
	}
	if info != nil {
		if info.requestID != "" {
			req.Header.Set("X-Request-Id", info.requestID)
		}
		if info.traceparent != "" {
			req.Header.Set("traceparent", info.traceparent)
		}
	}
	resp, err := t.base.RoundTrip(req)
	if t.learn != nil && resp != nil && resp.StatusCode == http.StatusOK {
		t.learn(req)
	}
	if info != nil && resp != nil && resp.StatusCode >= 400 {
		info.status.Store(int32(resp.StatusCode))
		if refusesOneCall(req, resp) {
			return callRefused(req, resp), nil
		}
	}
	return resp, err
}

// refusesOneCall reports whether resp refuses one call rather than the
// session: a 4xx to a POST, but for a lost session (404) and a rate
// limit (429). The SDK fails the whole session on such a status (in
// v1.8.0), which would take the upstream's tools off every list for one
// caller's oversized arguments or one refused token.
func refusesOneCall(req *http.Request, resp *http.Response) bool {
	return req.Method == http.MethodPost && resp.StatusCode >= 400 && resp.StatusCode < 500 &&
		resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusTooManyRequests
}

// callRefused answers the call's request with a JSON-RPC error in place
// of resp, so that the call fails and the session lives on; the status
// is kept in the call's callInfo for [Classify]. Without the request's
// id, resp is returned as it is.
func callRefused(req *http.Request, resp *http.Response) *http.Response {
	if req.GetBody == nil {
		return resp
	}
	body, err := req.GetBody()
	if err != nil {
		return resp
	}
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	err = json.NewDecoder(io.LimitReader(body, 1<<20)).Decode(&msg)
	body.Close()
	if err != nil || len(msg.ID) == 0 {
		return resp
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	out := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"upstream answered HTTP %d"}}`,
		msg.ID, resp.StatusCode)
	h := resp.Header.Clone()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
		Header: h, Body: io.NopCloser(strings.NewReader(out)), ContentLength: int64(len(out)), Request: req,
	}
}
