package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func quickRaw(url, tool string) Options {
	o := quick(url, tool)
	o.Mode = ModeRaw
	return o
}

// TestRawSpread: raw mode spreads the calls round-robin over every
// matching tool of a stateless server, whose SSE answers it checks.
func TestRawSpread(t *testing.T) {
	srv := startServer(t, true, 0)
	o := quickRaw(srv.url, "echo.*")
	o.Args = json.RawMessage(`{"message":"hi.there","n":1}`)
	r, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tools != 3 || r.OK == 0 || r.Ops != r.OK || len(r.Errors) != 0 || r.Sessions != 0 {
		t.Fatalf("tools %d, ok %d of %d, errors %v %v, sessions %d; want 3 tools and every call ok",
			r.Tools, r.OK, r.Ops, r.Errors, r.Examples, r.Sessions)
	}
	if r.Protocol != RawProtocol || r.Reconnects != 0 {
		t.Errorf("protocol %q, reconnects %d", r.Protocol, r.Reconnects)
	}
	checkLatency(t, r)
	c := counts(srv.counts())
	if len(c) != 3 || c.max()-c.min() > 1 {
		t.Errorf("calls per tool %v: want three tools within one call of each other", srv.counts())
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "raw HTTP, 6 connections, each answer checked") {
		t.Errorf("report:\n%s", text.String())
	}
}

// TestRawErrors: answers that are no echo of their call are failures,
// counted by code and not timed.
func TestRawErrors(t *testing.T) {
	srv := startServer(t, true, 0)
	// fixed answers whatever the call: a result that echoes nothing, or
	// a right result of another id.
	fixed := func(answer string) string {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(answer))
		}))
		t.Cleanup(hs.Close)
		return hs.URL
	}
	noEcho, _ := echoServer(t, func(w http.ResponseWriter, id json.RawMessage, _ string) {
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"bench"}]}}`, id)
	})
	tests := []struct {
		name, url, tool, code string
		token                 string
	}{
		{"isError", srv.url, "limited", "E_RATE_LIMITED", testToken},
		{"JSON-RPC error", srv.url, "nope", "jsonrpc -32602", testToken},
		{"refused", srv.url, "echo.a", "http/401", "wrong"},
		{"no echo", noEcho, "echo", CodeNoEcho, ""},
		{"another id", fixed(`{"jsonrpc":"2.0","id":0,"result":{"structuredContent":{"message":"bench-1"}}}`), "echo", CodeBadAnswer, ""},
		{"not JSON", fixed(`hello`), "echo", CodeBadAnswer, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := quickRaw(tt.url, tt.tool)
			o.Token = tt.token
			r, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK != 0 || r.Ops == 0 || r.Errors[tt.code] != r.Ops || len(r.Errors) != 1 {
				t.Fatalf("ok %d of %d, errors %v %v; want every call failed with %s", r.OK, r.Ops, r.Errors, r.Examples, tt.code)
			}
			if r.Examples[tt.code] == "" {
				t.Errorf("no example message for %s", tt.code)
			}
			if r.Latency.Max != 0 || len(r.Histogram) != 0 {
				t.Errorf("failed calls were timed: %+v", r.Latency)
			}
		})
	}
}

// echoServer answers every tools/call with the echo of its message, as
// answer writes it (as mcp-go does, by default); it counts connections.
func echoServer(t *testing.T, answer func(w http.ResponseWriter, id json.RawMessage, msg string)) (string, *atomic.Int32) {
	t.Helper()
	conns := new(atomic.Int32)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Params struct {
				Arguments struct {
					Message string `json:"message"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.Header.Get("Mcp-Protocol-Version") == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		answer(w, req.ID, req.Params.Arguments.Message)
	}))
	hs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.URL + "/mcp", conns
}

// TestRawAnswerForms: the answers of a right echo in the forms servers
// write them are ok: JSON of another member order (the decoding check),
// the message only in a text content's JSON, chunked, and a server that
// closes each connection (raw mode dials again).
func TestRawAnswerForms(t *testing.T) {
	tests := []struct {
		name   string
		answer func(w http.ResponseWriter, id json.RawMessage, msg string)
		redial bool
	}{
		{"id last", func(w http.ResponseWriter, id json.RawMessage, msg string) {
			fmt.Fprintf(w, `{"result":{"structuredContent":{"message":%q}},"jsonrpc":"2.0","id":%s}`, msg, id)
		}, false},
		{"text only", func(w http.ResponseWriter, id json.RawMessage, msg string) {
			text, _ := json.Marshal(map[string]string{"message": msg})
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":%q}]}}`, id, text)
		}, false},
		{"chunked SSE", func(w http.ResponseWriter, id json.RawMessage, msg string) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: message\ndata: ")
			w.(http.Flusher).Flush()
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"structuredContent":{"message":%q}}}`+"\n\n", id, msg)
		}, false},
		{"connection close", func(w http.ResponseWriter, id json.RawMessage, msg string) {
			w.Header().Set("Connection", "close")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"structuredContent":{"message":%q}}}`, id, msg)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, conns := echoServer(t, tt.answer)
			o := quickRaw(url, "echo")
			o.Token = ""
			r, err := Run(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			if r.OK == 0 || r.Ops != r.OK || len(r.Errors) != 0 {
				t.Fatalf("ok %d of %d, errors %v %v; want every call ok", r.OK, r.Ops, r.Errors, r.Examples)
			}
			if tt.redial != (r.Reconnects > 0) {
				t.Errorf("reconnects %d", r.Reconnects)
			}
			if n := int(conns.Load()); !tt.redial && n != o.Concurrency {
				t.Errorf("%d connections, want %d kept alive", n, o.Concurrency)
			}
		})
	}
}

// TestRawInterrupted: a cancelled run stops at once, even with every
// request waiting on a server that does not answer.
func TestRawInterrupted(t *testing.T) {
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer hs.Close()
	defer close(release)
	o := quickRaw(hs.URL, "echo")
	o.Duration, o.Warmup = time.Minute, -1
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	r, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("an interrupted run took %v", took)
	}
	if !r.Interrupted || r.OK != 0 {
		t.Errorf("interrupted %v, ok %d", r.Interrupted, r.OK)
	}
}

// TestRawRefusals: raw mode's own bad options fail before any load.
func TestRawRefusals(t *testing.T) {
	srv := startServer(t, true, 0)
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"https", func(o *Options) { o.URL = "https://127.0.0.1:1/mcp" }, "raw mode wants http"},
		{"message to escape", func(o *Options) { o.Args = json.RawMessage(`{"message":"a b"}`) }, "message of letters"},
		{"message not a string", func(o *Options) { o.Args = json.RawMessage(`{"message":1}`) }, "message of letters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := quickRaw(srv.url, "echo.a")
			tt.edit(&o)
			_, err := Run(t.Context(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run gave %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestReadAnswer: the HTTP/1.1 answers the raw client reads.
func TestReadAnswer(t *testing.T) {
	tests := []struct {
		name, in   string
		status     int
		body       string
		keep, fail bool
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", true, false},
		{"chunked", "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2;x=y\r\nhi\r\n3\r\n!!!\r\n0\r\nT: v\r\n\r\n", 200, "hi!!!", true, false},
		{"close", "HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 3\r\n\r\nno\n", 401, "no\n", false, false},
		{"to the end", "HTTP/1.0 200 OK\r\n\r\nall of it", 200, "all of it", false, false},
		{"continue first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", 200, "x", true, false},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\n", 204, "", true, false},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi", 200, "", false, true},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", false, true},
		{"bad chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 200, "", false, true},
		{"huge", fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", maxRawAnswer+1), 200, "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var body []byte
			status, keep, err := readAnswer(bufio.NewReader(strings.NewReader(tt.in)), &body)
			if tt.fail {
				if err == nil {
					t.Fatalf("read %d %q, want an error", status, body)
				}
				return
			}
			if err != nil || status != tt.status || string(body) != tt.body || keep != tt.keep {
				t.Errorf("got %d %q keep %v, %v; want %d %q keep %v", status, body, keep, err, tt.status, tt.body, tt.keep)
			}
		})
	}
}

// TestCheckAnswer: the quick check and the decoding one agree on what is
// an echo of call 7's message.
func TestCheckAnswer(t *testing.T) {
	msg := []byte("bench-7")
	tests := []struct {
		name, ans, code string
	}{
		{"structured", `{"jsonrpc":"2.0","id":7,"result":{"structuredContent":{"message":"bench-7"}}}`, ""},
		{"text JSON", `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"{\"message\":\"bench-7\"}"}]}}`, ""},
		{"SSE", "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"structuredContent\":{\"m\":\"bench-7\"}}}\r\n\r\n", ""},
		{"spaced", `{"jsonrpc": "2.0", "id": 7, "result": {"structuredContent": {"message": "bench-7"}}}`, ""},
		{"longer message", `{"jsonrpc":"2.0","id":7,"result":{"structuredContent":{"message":"bench-70"}}}`, CodeNoEcho},
		{"message in plain text", `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"said bench-7"}]}}`, CodeNoEcho},
		{"isError", `{"jsonrpc":"2.0","id":7,"result":{"isError":true,"structuredContent":{"message":"bench-7","code":"E_X"}}}`, "E_X"},
		{"error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"bench-7","data":{"code":"E_INTERNAL"}}}`, "jsonrpc -32603 E_INTERNAL"},
		{"other id", `{"jsonrpc":"2.0","id":8,"result":{"structuredContent":{"message":"bench-7"}}}`, CodeBadAnswer},
		{"string id", `{"jsonrpc":"2.0","id":"7","result":{"structuredContent":{"message":"bench-7"}}}`, CodeBadAnswer},
		{"null result", `{"jsonrpc":"2.0","id":7,"result":null}`, CodeBadAnswer},
		{"empty", ``, CodeBadAnswer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, why := checkAnswer([]byte(tt.ans), 7, msg); code != tt.code {
				t.Errorf("code %q (%s), want %q", code, why, tt.code)
			}
		})
	}
}

// TestRawBody: the request bodies carry the tool, the other arguments
// and a message unique to the call.
func TestRawBody(t *testing.T) {
	b, err := newRawBody(json.RawMessage(`{"z":[1],"message":"m","a":"b"}`), []string{"t.one", `t"two`})
	if err != nil {
		t.Fatal(err)
	}
	body, msg := b.appendCall(nil, 12, 1)
	if string(msg) != "m-12" {
		t.Errorf("message %q", msg)
	}
	var req struct {
		JSONRPC string         `json:"jsonrpc"`
		ID      int            `json:"id"`
		Method  string         `json:"method"`
		Params  map[string]any `json:"params"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	args, _ := json.Marshal(req.Params["arguments"])
	if req.JSONRPC != "2.0" || req.ID != 12 || req.Method != "tools/call" || req.Params["name"] != `t"two` ||
		string(args) != `{"a":"b","message":"m-12","z":[1]}` {
		t.Errorf("body %s", body)
	}
	if n := testing.AllocsPerRun(100, func() { body, _ = b.appendCall(body[:0], 13, 0) }); n != 0 {
		t.Errorf("a body allocates %v times", n)
	}
}
