package remote

import (
	"context"
	"encoding/json"
)

// Tool is one tool as an upstream lists it, under the upstream's own
// name. The schemas are the upstream's JSON, not checked here: the tier
// keeps only the tools its configuration allows and whose schemas it can
// serve.
type Tool struct {
	Name         string
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage // nil when the upstream declares none
}

// Client is one upstream as the remote tier talks to it, whatever its
// transport: an MCP server over stdio ([DialStdio]) or Streamable HTTP
// ([DialHTTP]), or a seed-002 action endpoint ([NewAction]). Its methods
// are safe for concurrent use. A failed List or Call returns an error that
// [Classify] maps to the closed set of codes.
type Client interface {
	// List returns every tool the upstream lists, all pages of them.
	List(ctx context.Context) ([]Tool, error)
	// Call calls tool with args (a JSON object; nil means {}) and returns
	// the upstream's CallToolResult as JSON, content, structuredContent
	// and isError, without its _meta. An isError result is the tool's own
	// answer, not an error of Call. meta is sent as the call's _meta, in
	// a map of the call's own: the tier puts the request id under
	// schemas.MetaRequestID and the trace context under schemas.MetaTraceparent;
	// over HTTP both also travel as the X-Request-Id and traceparent
	// headers.
	Call(ctx context.Context, tool string, args json.RawMessage, meta map[string]any) (json.RawMessage, error)
	// Changed delivers a value when the upstream said its tool list
	// changed; several notices while nobody reads come out as one. It is
	// nil for a transport that never says so.
	Changed() <-chan struct{}
	// Done is closed when the connection is gone for good (stdio: the
	// process exited; http: the session ended), so that the tier notices
	// a dead upstream at once rather than at its next call. It is nil
	// for an action endpoint, which has no connection.
	Done() <-chan struct{}
	// Close ends the connection and, for stdio, the process and every
	// process it started. It waits for them and is idempotent.
	Close() error
}

// isObject reports whether raw is one well-formed JSON object, white
// space around it allowed.
func isObject(raw []byte) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '{':
			return json.Valid(raw)
		}
		return false
	}
	return false
}

// objectArgs returns the arguments of a call: {} for none, and an error
// wrapping [ErrNotObject] for any that are not a JSON object (refused
// before anything is sent).
func objectArgs(args json.RawMessage) (json.RawMessage, error) {
	if len(args) == 0 {
		return json.RawMessage("{}"), nil
	}
	if !isObject(args) {
		return nil, ErrNotObject
	}
	return args, nil
}
