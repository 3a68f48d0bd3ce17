package roles

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// TestRelayRESTCancel: a relayed call made at the REST door (POST
// /mcp/tools/call) is cancelled from another replica as one made over
// MCP is: a notifications/cancelled naming its request id (X-Request-Id)
// ends it at once, and the listener is told the call was withdrawn.
func TestRelayRESTCancel(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	second := f.secondGateway(gatewayConfig{})
	mutating := []string{auth.ScopeMutating}
	tokA := f.token(auth.MintOptions{Subject: "agent-a", Scopes: mutating})
	tokB := f.token(auth.MintOptions{Subject: "agent-b", Scopes: mutating})
	a := f.listen(f.a.MCPURL(), tokA, twoTools)
	waitTool(t, second.gw, DefaultTenant, "a_send", true)

	const requestID = "rest-relayed-1"
	type answer struct {
		status int
		body   []byte
	}
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, second.url()+"/tools/call",
			strings.NewReader(`{"tool":"a_send","arguments":{"text":"wait for me"}}`))
		req.Header.Set("Authorization", "Bearer "+tokB)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json")
		req.Header.Set("X-Request-Id", requestID)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{}
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		answered <- answer{resp.StatusCode, body}
	}()
	ev := a.next(t)
	if ev.Type != "caller_tool_request" {
		t.Fatalf("the listener got %+v, want the REST call's request", ev)
	}

	// The cancel lands on the other replica (f.a), by the caller's token.
	cancel := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"` + requestID + `"}}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, f.a.MCPURL(), strings.NewReader(cancel))
	req.Header.Set("Authorization", "Bearer "+tokB)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/cancelled answered %d, want 202", resp.StatusCode)
	}

	ctx, stop := context.WithTimeout(t.Context(), 10*time.Second)
	defer stop()
	select {
	case got := <-answered:
		var e schemas.Error
		if got.status != http.StatusGatewayTimeout || json.Unmarshal(got.body, &e) != nil || e.Code != schemas.CodeDeadlineExceeded {
			t.Errorf("the cancelled REST call answered %d %s, want 504 E_DEADLINE_EXCEEDED", got.status, got.body)
		}
	case <-ctx.Done():
		t.Fatal("the REST call went on waiting after its caller cancelled it")
	}
	if got := a.next(t); got.Type != "caller_tool_cancelled" || got.RequestID != ev.RequestID {
		t.Errorf("after the cancel, the listener got %+v, want caller_tool_cancelled for %s", got, ev.RequestID)
	}
}
