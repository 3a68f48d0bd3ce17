package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/internal/child"
	"github.com/okso-io/okso/schemas"
)

// maxStdout is the most of a tool's stdout kept: more than any frame the
// agent reads or writes (1 MiB). The rest is read and dropped, so that a
// tool that writes a lot never blocks on a full pipe into a false timeout.
const maxStdout = 1 << 20

// LocalResult is a local tool's result (local.tool.run.output@1.0.0).
type LocalResult struct {
	NodeID    string `json:"node_id"`
	Stdout    string `json:"stdout"`
	ExitCode  int    `json:"exit_code"`
	Truncated bool   `json:"truncated"`
}

// fit returns the result encoded in at most room bytes, its stdout cut
// on a character boundary as far as needed (and truncated set), or nil
// when not even an empty stdout fits.
func (r *LocalResult) fit(room int) []byte {
	cut := *r
	cut.Truncated = true
	// enc encodes the result with stdout's first n bytes, less the start
	// of a character they cut: monotonic in n.
	enc := func(n int) []byte {
		for n > 0 && n < len(r.Stdout) && !utf8.RuneStart(r.Stdout[n]) {
			n--
		}
		cut.Stdout = r.Stdout[:n]
		b, _ := json.Marshal(&cut)
		return b
	}
	if len(enc(0)) > room {
		return nil
	}
	// Escaping makes a byte of stdout cost one to six bytes of JSON: the
	// longest prefix that fits is searched for.
	n := sort.Search(len(r.Stdout), func(n int) bool { return len(enc(n+1)) > room })
	return enc(n)
}

// WithLocalTools adds a device's local tools to o: their capabilities,
// announced to a tier that offers local_tools, and their handlers. A
// tool named as one of o's capabilities is an error.
func WithLocalTools(o Options, tools []LocalTool) (Options, error) {
	o.Capabilities = slices.Clone(o.Capabilities)
	o.Handlers = maps.Clone(o.Handlers)
	if o.Handlers == nil {
		o.Handlers = map[string]Handler{}
	}
	for _, t := range tools {
		for _, c := range o.Capabilities {
			if c.CapID == t.Name {
				return o, fmt.Errorf("local tool %s: the device has a capability of that name (%s)", t.Name, c.Kind)
			}
		}
		o.Capabilities = append(o.Capabilities, t.Capability())
		if t.Kind != "" {
			for _, v := range t.Verbs {
				o.Handlers[t.Name+"."+v] = KindHandler(t, v, o.NodeID, o.Logger)
			}
			continue
		}
		o.Handlers[t.Name+".run"] = LocalHandler(t, o.NodeID, o.Logger)
	}
	if len(o.Capabilities) > schemas.MaxCapabilities {
		return o, fmt.Errorf("%d capabilities with the local tools: a device announces at most %d", len(o.Capabilities), schemas.MaxCapabilities)
	}
	return o, nil
}

// A fitter is a result that can shrink to fit a frame.
type fitter interface{ fit(room int) []byte }

// LocalHandler returns the handler that runs a local tool for node
// nodeID: its command, as the leader of a process group of its own, with
// the query in TOOL_QUERY and nothing on stdin, for at most its timeout
// (or the call's deadline, if sooner). A run that exits is a result,
// whatever its exit status; a command that cannot start is E_INTERNAL; a
// run past its time is E_DEADLINE_EXCEEDED, its whole group killed and
// reaped. Stderr goes to log, at debug.
func LocalHandler(t LocalTool, nodeID string, log *slog.Logger) Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("tool", t.Name)
	return func(ctx context.Context, args json.RawMessage) (any, error) {
		var a struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(args, &a); err != nil {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments: "+err.Error())
		}
		if why := t.Query.check(a.Query); why != "" {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "query: "+why)
		}
		if strings.IndexByte(a.Query, 0) >= 0 { // the schema says so too; exec would refuse it
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "query: holds a NUL")
		}
		ctx, cancel := context.WithTimeout(ctx, t.Timeout)
		defer cancel()
		r, e := runTool(ctx, t, log, map[string]string{"TOOL_QUERY": a.Query}, nil, maxStdout)
		if e != nil {
			return nil, e
		}
		return &LocalResult{NodeID: nodeID, Stdout: strings.ToValidUTF8(string(r.stdout), "\uFFFD"),
			ExitCode: r.exitCode, Truncated: r.truncated}, nil
	}
}

// maxKindReply bounds what a registered kind's command may write: more
// than any frame the agent sends. A longer reply is E_INTERNAL.
const maxKindReply = 1 << 20

// KindHandler returns the handler of verb of a registered kind's
// capability t, for node nodeID (DESIGN.md §12): its command, as the
// leader of a process group of its own, gets seed 002's
// {"action":"call_tool","tool":verb,"arguments":...} on stdin and
// answers one {"type":"result","result":{...}} or
// {"type":"error","error":{name, category, message}} on stdout, within
// its timeout (or the call's deadline, if sooner). The result's node_id
// is set to nodeID (the gateway checks it against the node it called);
// an error's category maps to DESIGN.md §5's codes as the remote tier's
// action transport maps it ([action.Code]), and its message stays on
// the device (logged): the error the caller gets is okso's words. A
// command that cannot start, exits non-zero or answers anything else is
// E_INTERNAL; one past its time E_DEADLINE_EXCEEDED, its group killed
// and reaped. The arguments are not checked here: the agent has none of
// the kind's schemas, and the gateway checked them.
func KindHandler(t LocalTool, verb, nodeID string, log *slog.Logger) Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("tool", t.Name, "kind", t.Kind, "verb", verb)
	return func(ctx context.Context, args json.RawMessage) (any, error) {
		if !action.IsObject(args) {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments are not an object")
		}
		body, err := json.Marshal(action.Request{Action: action.CallTool, Tool: verb, Arguments: args})
		if err != nil {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not encode")
		}
		ctx, cancel := context.WithTimeout(ctx, t.Timeout)
		defer cancel()
		done, e := runTool(ctx, t, log, nil, append(body, '\n'), maxKindReply+1)
		if e != nil {
			return nil, e
		}
		out := done.stdout
		switch {
		case done.exitCode != 0:
			log.Warn("a kind's command failed", "exit_code", done.exitCode)
			return nil, schemas.NewError(schemas.CodeInternal, "the tool failed")
		case len(out) > maxKindReply:
			return nil, schemas.NewError(schemas.CodeInternal, "the tool's answer is too long")
		}
		r, err := action.DecodeReply(out)
		if err != nil {
			log.Warn("a kind's command answered outside the action protocol", "err", err)
			return nil, schemas.NewError(schemas.CodeInternal, "the tool's answer is not the action protocol's")
		}
		switch {
		case r.Type == "result" && action.IsObject(r.Result):
			var res map[string]json.RawMessage
			if err := json.Unmarshal(r.Result, &res); err != nil {
				return nil, schemas.NewError(schemas.CodeInternal, "the tool's result does not decode")
			}
			res["node_id"], _ = json.Marshal(nodeID)
			return res, nil
		case r.Type == "error" && action.IsObject(r.Error):
			var e action.Error
			_ = json.Unmarshal(r.Error, &e)
			code := action.Code(e.Category)
			log.Info("a kind's command answered an error", "category", e.Category, "message", e.Message, "code", code)
			return nil, schemas.NewError(code, "the tool answered "+code)
		}
		return nil, schemas.NewError(schemas.CodeInternal, "the tool's answer is neither a result nor an error")
	}
}

// ran is how a tool's command ended.
type ran struct {
	stdout    []byte // up to the keep given to runTool
	truncated bool   // it wrote more
	exitCode  int
}

// runTool runs a tool's command for one call: as the leader of a process
// group of its own, with the tool's environment plus env and the call's
// TRACEPARENT, stdin (nil: nothing, closed at once), and stdout read up
// to keep bytes and the rest dropped, so that a command that writes a lot
// never blocks into a false timeout. Past ctx's end its whole group is
// killed and reaped: E_DEADLINE_EXCEEDED; a command that cannot start is
// E_INTERNAL.
func runTool(ctx context.Context, t LocalTool, log *slog.Logger, env map[string]string, stdin []byte, keep int64) (ran, *schemas.Error) {
	all := maps.Clone(t.Env)
	if all == nil {
		all = make(map[string]string, len(env)+1)
	}
	maps.Copy(all, env)
	if tp := Traceparent(ctx); tp != "" {
		all["TRACEPARENT"] = tp // OpenTelemetry's environment carrier
	}
	p, err := child.Start(child.Options{Argv: t.Command, Env: all, Dir: t.Dir, Log: log,
		LogMessage: "tool stderr", LogLevel: slog.LevelDebug})
	if err != nil {
		log.Warn("a tool's command did not start", "err", err)
		return ran{}, schemas.NewError(schemas.CodeInternal, "the tool did not start")
	}
	wrote := make(chan struct{})
	if stdin == nil {
		p.Stdin.Close()
		close(wrote)
	} else {
		if d, ok := ctx.Deadline(); ok {
			_ = p.Stdin.SetWriteDeadline(d) // a command that reads nothing cannot hold the call
		}
		go func() {
			defer close(wrote)
			_, _ = p.Stdin.Write(stdin)
			p.Stdin.Close()
		}()
	}
	read := make(chan ran, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(p.Stdout, keep))
		n, _ := io.Copy(io.Discard, p.Stdout)
		read <- ran{stdout: b, truncated: n > 0}
	}()
	killed := false
	select {
	case <-p.Exited():
	case <-ctx.Done():
		p.Kill()
		killed = true
	}
	<-p.Done()
	r := <-read // the pipes end once the group is gone (child.Start)
	<-wrote
	p.Stdout.Close()
	if killed {
		log.Info("a tool's command ran out of time: its process group was killed", "timeout", t.Timeout)
		return ran{}, schemas.NewError(schemas.CodeDeadlineExceeded, "the tool ran out of time")
	}
	r.exitCode = p.ExitCode()
	return r, nil
}
