package roles

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/internal/bearer"
)

// listChangedClient connects an MCP client to url that reports each
// tools/list_changed on the returned channel.
func (f *fixture) listChangedClient(url, token, version string) (*sdk.ClientSession, <-chan struct{}) {
	f.t.Helper()
	changed := make(chan struct{}, 16)
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) {
			select {
			case changed <- struct{}{}:
			default:
			}
		},
	})
	tr := &sdk.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: http.DefaultTransport}},
		MaxRetries: -1,
	}
	s, err := c.Connect(f.t.Context(), tr, &sdk.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		f.t.Fatalf("connect MCP client: %v", err)
	}
	f.t.Cleanup(func() { _ = s.Close() })
	return s, changed
}

// TestCapabilitiesTruthful: the gateway declares what it serves, and
// only that. It serves tools and nothing else (prompts/*, resources/*
// are not found, not empty), and it claims tools.listChanged only where
// the client can receive it: on a stateful gateway, and on a stateless
// one from 2026-07-28 (subscriptions/listen), where a new device then
// does reach the client.
func TestCapabilitiesTruthful(t *testing.T) {
	f := startAllInOne(t, 1, nil)
	stateful := f.secondGateway(gatewayConfig{Stateful: true}).url()
	tok := f.token(auth.MintOptions{})
	cases := []struct {
		name, url, version string
		listChanged        bool
	}{
		{"stateless 2025-11-25", f.a.MCPURL(), "2025-11-25", false},
		{"stateless 2025-06-18", f.a.MCPURL(), "2025-06-18", false},
		{"stateless 2026-07-28", f.a.MCPURL(), "2026-07-28", true},
		{"stateful 2025-11-25", stateful, "2025-11-25", true},
	}
	type client struct {
		s       *sdk.ClientSession
		changed <-chan struct{}
	}
	clients := map[string]client{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, changed := f.listChangedClient(c.url, tok, c.version)
			clients[c.name] = client{s, changed}
			caps := s.InitializeResult().Capabilities
			if caps.Tools == nil || caps.Tools.ListChanged != c.listChanged {
				t.Errorf("tools capability %+v, want listChanged %v", caps.Tools, c.listChanged)
			}
			//lint:ignore SA1019 logging is deprecated from 2026-07-28, and still declared for 2025 clients
			if caps.Prompts != nil || caps.Resources != nil || caps.Completions != nil || caps.Logging == nil {
				t.Errorf("capabilities %+v: want tools and logging only", caps)
			}
			_, err := s.ListPrompts(t.Context(), nil)
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeMethodNotFound {
				t.Errorf("prompts/list: %v, want -32601", err)
			}
			_, err = s.ListResources(t.Context(), nil)
			if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeMethodNotFound {
				t.Errorf("resources/list: %v, want -32601", err)
			}
		})
	}
	// A client that was told listChanged hears about a new device.
	f.connectDevice(DefaultTenant, nil)
	for _, c := range cases {
		if !c.listChanged {
			continue
		}
		select {
		case <-clients[c.name].changed:
		case <-time.After(10 * time.Second):
			t.Errorf("%s: no tools/list_changed for a new device", c.name)
		}
	}
}
