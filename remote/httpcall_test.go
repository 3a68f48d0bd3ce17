package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
	"github.com/okso-io/okso/schemas"
)

// answering serves the test upstream, but answers the calls of a few
// tools itself, the way other servers may: an event stream with
// notifications and a request of the server's before the answer, a JSON
// body, a stream cut short, a result of a kind okso does not relay. Every
// message the client POSTs that is not a request (a response, a
// notification) is sent on posted.
func answering(t *testing.T) (remote.Client, <-chan string) {
	t.Helper()
	u := testupstream.New(testupstream.Options{})
	inner := u.Handler()
	posted := make(chan string, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			inner.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		if msg.Method == "" || len(msg.ID) == 0 {
			select {
			case posted <- string(body):
			default:
			}
		}
		if msg.Method != "tools/call" {
			inner.ServeHTTP(w, r)
			return
		}
		answer := func(result string) string {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, msg.ID, result)
		}
		const ok = `{"content":[{"type":"text","text":"ok"}],"structuredContent":{"ok":true},"_meta":{"upstream":"private"}}`
		stream := func(events ...string) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, e := range events {
				fmt.Fprintf(w, "event: message\n%s\n\n", e)
			}
		}
		switch msg.Params.Name {
		case "noisy":
			// A priming event, a progress notification, a request of the
			// server's, and the answer split over two data lines (which
			// join with a newline, white space to JSON).
			half := strings.Index(answer(ok), `"result"`)
			stream("id: 0\ndata:",
				`data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`,
				`data: {"jsonrpc":"2.0","id":99,"method":"roots/list"}`,
				"data: "+answer(ok)[:half]+"\ndata: "+answer(ok)[half:])
		case "plain_json":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, answer(ok))
		case "cut":
			stream(`data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}`)
		case "input":
			stream("data: " + answer(`{"resultType":"input_required","inputRequests":{"a":{"method":"elicitation/create","params":{}}}}`))
		case "video":
			stream("data: " + answer(`{"content":[{"type":"video","data":"AAAA"}]}`))
		case "text_plain":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, answer(ok))
		case "rpc_error":
			stream("data: " + fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32602,"message":"unknown tool \"rpc_error\""}}`, msg.ID))
		default:
			inner.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(u.Release) // before srv.Close: a hang left running would hold it
	c := dialHTTP(t, srv.URL, nil)
	list(t, c, true)
	return c, posted
}

// TestHTTPCallAnswers: a call's answer as other servers than the SDK's
// may send it: the result passes on without its _meta, the server's own
// request is answered as the SDK's client would, and an answer okso
// cannot pass on is a clear error.
func TestHTTPCallAnswers(t *testing.T) {
	c, posted := answering(t)
	for _, tool := range []string{"noisy", "plain_json"} {
		raw, err := c.Call(bounded(t), tool, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if want := `{"content":[{"type":"text","text":"ok"}],"structuredContent":{"ok":true}}`; string(raw) != want {
			t.Errorf("%s = %s, want %s", tool, raw, want)
		}
	}
	for answered := false; !answered; {
		select {
		case got := <-posted:
			if strings.Contains(got, `"id":99`) {
				answered = true
				if want := `{"jsonrpc":"2.0","id":99,"result":{"roots":[]}}`; got != want {
					t.Errorf("the answer to the upstream's roots/list: %s, want %s", got, want)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream's roots/list was never answered")
		}
	}
	for tool, want := range map[string]struct {
		code      string
		transient bool
	}{
		"cut":        {schemas.CodeNodeOffline, true},
		"input":      {schemas.CodeInternal, false},
		"video":      {schemas.CodeInternal, false},
		"text_plain": {schemas.CodeInternal, false},
		"rpc_error":  {schemas.CodeToolNotFound, false},
	} {
		_, err := c.Call(bounded(t), tool, nil, nil)
		wantCode(t, err, want.code, want.transient)
	}
}

// TestHTTPCallCancelled: a call whose deadline passes tells the upstream,
// which stops the tool.
func TestHTTPCallCancelled(t *testing.T) {
	c, posted := answering(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Call(ctx, "hang", nil, nil)
	wantCode(t, err, schemas.CodeDeadlineExceeded, false)
	for {
		select {
		case got := <-posted:
			if strings.Contains(got, `"notifications/cancelled"`) {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the upstream was never told that the call was cancelled")
		}
	}
}
