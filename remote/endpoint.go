package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/action"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/schemas"
)

// The seed-002 action protocol, served (DESIGN.md §9.2): okso endpoint
// answers one request on its stdin with one JSON object on its stdout,
// for the tools a token may call through a gateway, so that a shell
// script (or another runtime's MCP_ENDPOINT) can list and call okso's
// tools without speaking MCP.

// maxEndpointRequest bounds the request read from stdin.
const maxEndpointRequest = 4 << 20

// EndpointOptions configure [ServeEndpoint].
type EndpointOptions struct {
	URL   string // the gateway's MCP endpoint
	Token string // an agent token, sent as a bearer token
	// HTTPClient carries the MCP requests; nil: http.DefaultClient's
	// transport.
	HTTPClient *http.Client
	// Version is reported to the gateway as the client's.
	Version string
}

// ServeEndpoint reads one request from in and writes its answer to out:
// {"type":"result",...} or {"type":"error","error":{...}}. A request
// that is not one JSON object, or whose arguments are not an object, is
// refused before anything is sent. The error it returns is only that of
// writing the answer.
func ServeEndpoint(ctx context.Context, o EndpointOptions, in io.Reader, out io.Writer) error {
	answer, aerr := endpointAnswer(ctx, o, in)
	if aerr != nil {
		answer = map[string]any{"type": "error", "error": aerr}
	}
	b, err := json.Marshal(answer)
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}

func endpointAnswer(ctx context.Context, o EndpointOptions, in io.Reader) (any, *action.Error) {
	raw, err := io.ReadAll(io.LimitReader(in, maxEndpointRequest+1))
	if err != nil {
		return nil, action.Usage("cannot read the request")
	}
	if len(raw) > maxEndpointRequest {
		return nil, action.Usage(fmt.Sprintf("request over %d bytes", maxEndpointRequest))
	}
	req, aerr := action.DecodeRequest(raw)
	if aerr != nil {
		return nil, aerr
	}
	s, aerr := connectGateway(ctx, o)
	if aerr != nil {
		return nil, aerr
	}
	defer func() { _ = s.Close() }()
	switch req.Action {
	case action.ListTools:
		var ds []action.Descriptor
		for t, err := range s.Tools(ctx, nil) {
			if err != nil {
				return nil, rpcError(err)
			}
			ds = append(ds, descriptorOf(t, o.URL))
		}
		return map[string]any{"type": "result", "tools": ds}, nil
	case action.DescribeTool:
		for t, err := range s.Tools(ctx, nil) {
			if err != nil {
				return nil, rpcError(err)
			}
			// Asked by either of its names (DESIGN.md §8): the listed one,
			// or the canonical one the gateway gives in _meta beside a
			// safe name.
			if canonical, _ := t.Meta[schemas.MetaName].(string); req.Tool == t.Name || req.Tool == canonical && canonical != "" {
				return map[string]any{"type": "result", "tool": descriptorOf(t, o.URL)}, nil
			}
		}
		return nil, action.FromEnvelope(schemas.NewError(schemas.CodeToolNotFound, "no such tool for this token"))
	}
	res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: req.Tool, Arguments: req.Arguments})
	if err != nil {
		return nil, rpcError(err)
	}
	if res.IsError {
		return nil, toolError(req.Tool, res)
	}
	var result any = res.StructuredContent
	if result == nil {
		result = map[string]any{"content": res.Content}
	}
	return map[string]any{"type": "result", "tool": req.Tool, "result": result}, nil
}

func connectGateway(ctx context.Context, o EndpointOptions) (*sdk.ClientSession, *action.Error) {
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	base := hc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	client := *hc
	client.Transport = bearer.Transport{Token: o.Token, Base: base}
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-endpoint", Version: cmpOr(o.Version, "dev")}, nil)
	s, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: o.URL, HTTPClient: &client, MaxRetries: -1},
		&sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		if strings.Contains(err.Error(), http.StatusText(http.StatusUnauthorized)) {
			return nil, action.FromEnvelope(schemas.NewError(schemas.CodeSafetyDenied, "the gateway refused the token"))
		}
		return nil, action.FromEnvelope(schemas.NewError(schemas.CodeInternal, "cannot reach the gateway"))
	}
	return s, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// rpcError is a JSON-RPC error of the gateway: its envelope when it
// carries one (an unknown tool does), else a fatal error.
func rpcError(err error) *action.Error {
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		var e schemas.Error
		if json.Unmarshal(we.Data, &e) == nil && schemas.KnownCode(e.Code) {
			return action.FromEnvelope(&e)
		}
	}
	return action.FromEnvelope(schemas.NewError(schemas.CodeInternal, "the gateway failed the request"))
}

// toolError is a failed call: okso's envelope when okso failed it; when
// the tool did (a federated upstream's isError), the tool's own words,
// bounded, under the tool's name, never as okso's.
func toolError(tool string, res *sdk.CallToolResult) *action.Error {
	if raw, ok := res.Meta[schemas.MetaError]; ok {
		b, _ := json.Marshal(raw)
		var e schemas.Error
		if json.Unmarshal(b, &e) == nil && schemas.KnownCode(e.Code) {
			return action.FromEnvelope(&e)
		}
	}
	var text bytes.Buffer
	for _, c := range res.Content {
		if t, ok := c.(*sdk.TextContent); ok {
			text.WriteString(t.Text)
		}
	}
	msg := text.String()
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	return &action.Error{Name: tool, Category: schemas.Category(schemas.CodeNodeOffline), Message: msg}
}

// descriptorOf is a listed tool as a seed-002 descriptor.
func descriptorOf(t *sdk.Tool, url string) action.Descriptor {
	class, _ := t.Meta[schemas.MetaSafetyClass].(string)
	d := action.Descriptor{
		Name:        t.Name,
		Description: t.Description,
		Command: fmt.Sprintf(`echo '{"action":"call_tool","tool":"%s","arguments":{}}' | okso endpoint --url %s --token "$OKSO_TOKEN"`,
			t.Name, url),
		Origin:       "remote",
		Safety:       safetyWords(class),
		InputSchema:  schemaJSON(t.InputSchema),
		ResultSchema: schemaJSON(t.OutputSchema),
	}
	if d.ResultSchema == nil {
		d.ResultSchema = json.RawMessage(`{"type":"object"}`)
	}
	return d
}

// safetyWords says a safety class and what it takes, in words.
func safetyWords(class string) string {
	switch class {
	case schemas.SafetyReadOnly:
		return "read_only: reads state, changes nothing; needs scope tools:call:read_only"
	case schemas.SafetyMutating:
		return "mutating: changes state; needs scope tools:call:mutating"
	case schemas.SafetyDestructive:
		return "destructive: may destroy state; needs scope tools:call:destructive"
	}
	return "unclassified"
}

func schemaJSON(s any) json.RawMessage {
	if s == nil {
		return nil
	}
	b, err := json.Marshal(s)
	if err != nil || string(b) == "null" {
		return nil
	}
	return b
}
