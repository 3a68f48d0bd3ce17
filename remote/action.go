package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/internal/child"
)

// ActionOptions configure [NewAction].
type ActionOptions struct {
	// Command is the endpoint's argv, run once per request; Command[0] is
	// looked up in the tier's PATH unless it holds a slash.
	Command []string
	// Env is the process's whole environment besides the tier's PATH and
	// HOME (which Env may override).
	Env map[string]string
	// Timeout bounds each request, from start to reply (10 s).
	Timeout time.Duration
	// Log gets the process's stderr, a line each, bounded. Nil: discarded.
	Log *slog.Logger
}

const (
	defaultActionTimeout = 10 * time.Second
	// maxActionReply bounds an endpoint's reply; a longer one is an error.
	maxActionReply = 4 << 20
)

// NewAction returns a [Client] of a seed-002 action endpoint
// (DESIGN.md §9.2): every List and Call runs Command once, in a process
// group of its own, writes one JSON object on its stdin and reads exactly
// one from its stdout. A reply that is not one JSON object, a process that
// exits non-zero, or a reply longer than 4 MiB is an error (E_INTERNAL);
// a request that runs past the timeout or its context is killed with its
// group (E_DEADLINE_EXCEEDED). Arguments that are not a JSON object are
// refused before anything runs ([ErrNotObject]).
//
// A descriptor's input_schema becomes the tool's InputSchema, its
// result_schema the OutputSchema, and its safety text ends the
// description. A call's result becomes a CallToolResult whose
// structuredContent is the result and whose one text content is the
// result's JSON; an error reply ({type:"error"}) is the tool's own
// answer: an isError result whose text is the error object's JSON.
//
// The client also has a Describe(ctx, tool) (Tool, error) method, for
// describe_tool. Changed and Done are nil: an endpoint has no connection
// to lose and no way to say its tools changed. Close waits for the
// requests under way, killing their processes.
func NewAction(o ActionOptions) Client {
	if o.Timeout <= 0 {
		o.Timeout = defaultActionTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &actionClient{o: o, closing: make(chan struct{})}
}

type actionClient struct {
	o ActionOptions

	mu      sync.Mutex
	closed  bool
	running sync.WaitGroup
	closing chan struct{} // closed by Close
}

// describedTool is a tool as an action endpoint describes it.
func describedTool(d *action.Descriptor) (Tool, error) {
	if d.Name == "" {
		return Tool{}, fmt.Errorf("%w: a tool has no name", action.ErrBadReply)
	}
	t := Tool{Name: d.Name, Description: d.Description, InputSchema: schemaOrNil(d.InputSchema), OutputSchema: schemaOrNil(d.ResultSchema)}
	if d.Safety != "" {
		if t.Description != "" {
			t.Description += "\n\n"
		}
		t.Description += "Safety: " + d.Safety
	}
	return t, nil
}

func schemaOrNil(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	return raw
}

// errEndpointRefused: the endpoint answered list_tools or describe_tool
// with an error.
var errEndpointRefused = errors.New("the endpoint answered with an error")

func (a *actionClient) List(ctx context.Context) ([]Tool, error) {
	r, err := a.run(ctx, action.ListTools, action.Request{Action: action.ListTools})
	if err != nil {
		return nil, err
	}
	if r.Type == "error" {
		return nil, fmt.Errorf("action list_tools: %w", errEndpointRefused)
	}
	if r.Type != "result" || r.Tools == nil {
		return nil, fmt.Errorf("action list_tools: %w: no tools", action.ErrBadReply)
	}
	tools := make([]Tool, 0, len(r.Tools))
	for i := range r.Tools {
		t, err := describedTool(&r.Tools[i])
		if err != nil {
			return nil, fmt.Errorf("action list_tools: %w", err)
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// Describe asks the endpoint for one tool's descriptor (describe_tool).
func (a *actionClient) Describe(ctx context.Context, tool string) (Tool, error) {
	r, err := a.run(ctx, action.DescribeTool, action.Request{Action: action.DescribeTool, Tool: tool})
	if err != nil {
		return Tool{}, err
	}
	if r.Type == "error" {
		return Tool{}, fmt.Errorf("action describe_tool: %w", errEndpointRefused)
	}
	var d action.Descriptor
	if r.Type != "result" || !isObject(r.Tool) || json.Unmarshal(r.Tool, &d) != nil {
		return Tool{}, fmt.Errorf("action describe_tool: %w: no descriptor", action.ErrBadReply)
	}
	t, err := describedTool(&d)
	if err != nil {
		return Tool{}, fmt.Errorf("action describe_tool: %w", err)
	}
	return t, nil
}

func (a *actionClient) Call(ctx context.Context, tool string, args json.RawMessage, meta map[string]any) (json.RawMessage, error) {
	args, err := objectArgs(args)
	if err != nil {
		return nil, fmt.Errorf("action call_tool %s: arguments: %w", tool, err)
	}
	r, err := a.run(ctx, action.CallTool, action.Request{Action: action.CallTool, Tool: tool, Arguments: args, Meta: meta})
	if err != nil {
		return nil, err
	}
	var res any
	switch {
	case r.Type == "result" && isObject(r.Result):
		var text bytes.Buffer
		_ = json.Compact(&text, r.Result)
		res = struct {
			Content           []mcp.Content   `json:"content"`
			StructuredContent json.RawMessage `json:"structuredContent"`
		}{[]mcp.Content{&mcp.TextContent{Text: text.String()}}, r.Result}
	case r.Type == "error" && isObject(r.Error):
		var text bytes.Buffer
		_ = json.Compact(&text, r.Error)
		res = struct {
			Content []mcp.Content `json:"content"`
			IsError bool          `json:"isError"`
		}{[]mcp.Content{&mcp.TextContent{Text: text.String()}}, true}
	default:
		return nil, fmt.Errorf("action call_tool %s: %w: neither a result object nor an error object", tool, action.ErrBadReply)
	}
	out, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("action call_tool %s: encode result: %w", tool, err)
	}
	return out, nil
}

func (a *actionClient) Changed() <-chan struct{} { return nil }
func (a *actionClient) Done() <-chan struct{}    { return nil }

func (a *actionClient) Close() error {
	a.mu.Lock()
	if !a.closed {
		a.closed = true
		close(a.closing)
	}
	a.mu.Unlock()
	a.running.Wait()
	return nil
}

// run runs the endpoint once with req on its stdin and decodes its reply.
func (a *actionClient) run(ctx context.Context, what string, req action.Request) (*action.Reply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("action %s: encode request: %w", what, err)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, fmt.Errorf("action %s: %w", what, mcp.ErrConnectionClosed)
	}
	a.running.Add(1)
	a.mu.Unlock()
	defer a.running.Done()

	ctx, cancel := context.WithTimeout(ctx, a.o.Timeout)
	defer cancel()
	p, err := child.Start(child.Options{Argv: a.o.Command, Env: a.o.Env, Log: a.o.Log, LogMessage: "upstream stderr"})
	if err != nil {
		return nil, fmt.Errorf("action %s: %w", what, err)
	}
	defer p.Stdout.Close()
	wrote := make(chan struct{})
	// A process that leaves its stdin unread (one it started may hold it)
	// must not keep the write, and so the call, past its deadline.
	if d, ok := ctx.Deadline(); ok {
		_ = p.Stdin.SetWriteDeadline(d)
	}
	go func() {
		defer close(wrote)
		_, _ = p.Stdin.Write(append(body, '\n')) // EPIPE if it reads nothing: its business
		p.Stdin.Close()
	}()
	type output struct {
		b   []byte
		err error
	}
	read := make(chan output, 1)
	go func() {
		b, err := io.ReadAll(io.LimitReader(p.Stdout, maxActionReply+1))
		read <- output{b, err}
	}()

	var (
		out output
		got bool
	)
	select {
	case out = <-read:
		got = true
	case <-ctx.Done():
	case <-a.closing:
	}
	if !got { // no reply yet: end it
		p.Kill()
		<-read
		<-wrote
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("action %s: no reply within %v: %w", what, a.o.Timeout, err)
		}
		return nil, fmt.Errorf("action %s: %w", what, mcp.ErrConnectionClosed)
	}
	if len(out.b) > maxActionReply {
		p.Kill()
		<-wrote
		return nil, fmt.Errorf("action %s: %w: longer than %d bytes", what, action.ErrBadReply, maxActionReply)
	}
	// Its stdout is closed: it is exiting, or should.
	select {
	case <-p.Exited():
	case <-ctx.Done():
		p.Kill()
	case <-a.closing:
		p.Kill()
	}
	<-p.Done()
	<-wrote
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("action %s: did not exit within %v: %w", what, a.o.Timeout, err)
	}
	if p.Err() != nil {
		return nil, fmt.Errorf("action %s: endpoint failed: %w", what, p.Err())
	}
	if out.err != nil && !errors.Is(out.err, os.ErrDeadlineExceeded) {
		return nil, fmt.Errorf("action %s: read reply: %w", what, out.err)
	}
	r, err := action.DecodeReply(out.b)
	if err != nil {
		return nil, fmt.Errorf("action %s: %w", what, err)
	}
	return r, nil
}
