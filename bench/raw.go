package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Raw mode is a wrk-like load without an MCP client: each of Concurrency
// workers owns one keep-alive HTTP/1.1 connection and POSTs a JSON-RPC
// tools/call on it, waits for the answer, and POSTs the next. It suits
// any server that answers a tools/call without a session (a stateless
// Streamable HTTP server: okso's gateway, mcp-go's or the go-sdk's
// stateless mode), as application/json or as an SSE stream. The client
// is a few lines over the connection, not net/http's, so that the load
// generator spends little of a shared machine's CPU.
//
// Unlike wrk it checks every answer: the call's message argument is made
// unique ("bench-17" for the 17th call) and the answer counts as ok only
// when it is the JSON-RPC result of that request's id, not isError, and
// echoes the message in one of its strings (a structuredContent member,
// or inside a text content's JSON). Anything else is a failure with a
// code: "http/<status>", the JSON-RPC or envelope code, CodeNoEcho,
// CodeBadAnswer, or a transport code.

// Codes of raw mode's failures.
const (
	CodeNoEcho    = "no-echo"    // a result that does not echo the call's message
	CodeBadAnswer = "bad-answer" // an answer that is no JSON-RPC response to the request
)

// RawProtocol is the Mcp-Protocol-Version raw mode sends when
// [Options.Protocol] is empty: the newest revision whose requests need no
// per-request client metadata.
const RawProtocol = "2025-11-25"

// rawTimeout bounds one raw request, from its write to its answer's end.
const rawTimeout = 30 * time.Second

// maxRawAnswer bounds one answer's body.
const maxRawAnswer = 4 << 20

// rawMessage is what a raw call's message may hold: characters its JSON
// and any JSON it is nested in write as they are, so that the check can
// look for its bytes.
var rawMessage = regexp.MustCompile(`^[A-Za-z0-9._-]*$`)

// rawTarget is the endpoint of a raw run.
type rawTarget struct {
	addr string // host:port to dial
	head []byte // the request line and headers up to Content-Length's value
}

func newRawTarget(o *Options, proto string) (*rawTarget, error) {
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("url %q: raw mode wants http://host:port/path", o.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	var h strings.Builder
	fmt.Fprintf(&h, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: okso-bench\r\n", u.RequestURI(), u.Host)
	h.WriteString("Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n")
	fmt.Fprintf(&h, "Mcp-Protocol-Version: %s\r\n", proto)
	if o.Token != "" {
		fmt.Fprintf(&h, "Authorization: Bearer %s\r\n", o.Token)
	}
	h.WriteString("Content-Length: ")
	return &rawTarget{addr: addr, head: []byte(h.String())}, nil
}

// rawBody builds the request bodies of raw mode: Args with its message
// member set to a unique text per call.
type rawBody struct {
	base  string // the message's text, before "-<seq>"
	names [][]byte
	rest  []byte // the other members of the arguments, encoded, each followed by ","; or empty
}

func newRawBody(args json.RawMessage, tools []string) (*rawBody, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil {
		return nil, fmt.Errorf("args %s: %w", args, err)
	}
	b := &rawBody{base: "bench"}
	if v, ok := m["message"]; ok {
		if json.Unmarshal(v, &b.base) != nil || !rawMessage.MatchString(b.base) {
			return nil, fmt.Errorf("args %s: raw mode wants a message of letters, digits, '.', '_' or '-'", args)
		}
		delete(m, "message")
	}
	if len(m) > 0 {
		rest, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("args %s: %w", args, err)
		}
		b.rest = append(rest[1:len(rest)-1:len(rest)-1], ',')
	}
	for _, t := range tools {
		n, err := json.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("tool %q: %w", t, err)
		}
		b.names = append(b.names, n)
	}
	return b, nil
}

// appendCall appends the body of call seq to tool i and returns it with
// the message it carries.
func (b *rawBody) appendCall(dst []byte, seq uint64, i int) (body, msg []byte) {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"method":"tools/call","params":{"name":`...)
	dst = append(dst, b.names[i]...)
	dst = append(dst, `,"arguments":{`...)
	dst = append(dst, b.rest...)
	dst = append(dst, `"message":"`...)
	m := len(dst)
	dst = append(dst, b.base...)
	dst = append(dst, '-')
	dst = strconv.AppendUint(dst, seq, 10)
	msg = dst[m:]
	dst = append(dst, `"}}}`...)
	return dst, msg
}

// rawConn is a worker's connection; the mutex guards c against the
// run's end, which sets its deadline from another goroutine.
type rawConn struct {
	mu     sync.Mutex
	c      net.Conn
	br     *bufio.Reader
	closed bool // the run ended: dial no more
}

func (rc *rawConn) set(c net.Conn) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		_ = c.Close()
		return false
	}
	rc.c = c
	if rc.br == nil {
		rc.br = bufio.NewReaderSize(c, 16<<10)
	} else {
		rc.br.Reset(c)
	}
	return true
}

// arm sets the deadline of the request about to be written; false when
// the run has ended.
func (rc *rawConn) arm(t time.Time) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		return false
	}
	_ = rc.c.SetDeadline(t)
	return true
}

// stop ends the connection's current request at once.
func (rc *rawConn) stop() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.closed = true
	if rc.c != nil {
		_ = rc.c.SetDeadline(time.Unix(1, 0))
	}
}

func (rc *rawConn) drop() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.c != nil {
		_ = rc.c.Close()
		rc.c = nil
	}
}

// runRaw runs raw mode over tools and fills in res.
func runRaw(ctx context.Context, o *Options, tools []string, res *Result) (*Result, error) {
	proto := o.Protocol
	if proto == "" {
		proto = RawProtocol
	}
	res.Protocol = proto
	target, err := newRawTarget(o, proto)
	if err != nil {
		return nil, err
	}
	body, err := newRawBody(o.Args, tools)
	if err != nil {
		return nil, err
	}

	var (
		done, failed atomic.Uint64 // every completed request, warm-up included
		seq          atomic.Uint64 // ids and messages; round-robin over tools
		workers      = make([]worker, o.Concurrency)
		conns        = make([]rawConn, o.Concurrency)
		wg           sync.WaitGroup
		stop         = make(chan struct{})
		start        = time.Now()
		end          = o.Warmup + o.Duration
	)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stopConns := context.AfterFunc(runCtx, func() {
		for i := range conns {
			conns[i].stop()
		}
	})
	defer stopConns()
	drainDone := drain(ctx, cancel, stop, end)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	for i := range workers {
		w, rc := &workers[i], &conns[i]
		wg.Go(func() {
			defer rc.drop()
			w.runRaw(runCtx, ctx, dialer, rc, target, body, &seq, start, o.Warmup, end, o.more, &done, &failed)
		})
	}
	progressDone := progressCalls(o, stop, start, &done, &failed)
	wg.Wait()
	close(stop)
	<-progressDone
	<-drainDone

	measured := min(time.Since(start), end) - o.Warmup
	res.Interrupted = ctx.Err() != nil
	res.tally(workers, measured)
	return res, nil
}

// runRaw makes calls on its connection until the time is up. ctx is the
// run's (it ends after the drain), parent the caller's (it stops new
// calls). A connection that fails is dropped and dialled again.
func (w *worker) runRaw(ctx, parent context.Context, d *net.Dialer, rc *rawConn, t *rawTarget, b *rawBody,
	seq *atomic.Uint64, start time.Time, warmup, end time.Duration, more func() bool, done, failed *atomic.Uint64) {
	var (
		req, bodyBuf []byte
		ans          []byte
		dialled      bool
	)
	for parent.Err() == nil && time.Since(start) < end && more() {
		if rc.c == nil {
			c, err := d.DialContext(ctx, "tcp", t.addr)
			if err != nil {
				failed.Add(1)
				if time.Since(start) >= warmup {
					w.failed++
					w.fail(CodeTransport, err.Error())
				}
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			if !rc.set(c) {
				return
			}
			if dialled {
				w.reconnects++
			}
			dialled = true
		}
		n := seq.Add(1)
		var msg []byte
		bodyBuf, msg = b.appendCall(bodyBuf[:0], n, int((n-1)%uint64(len(b.names))))
		req = append(req[:0], t.head...)
		req = strconv.AppendInt(req, int64(len(bodyBuf)), 10)
		req = append(req, "\r\n\r\n"...)
		req = append(req, bodyBuf...)

		t0 := time.Now()
		if !rc.arm(t0.Add(rawTimeout)) {
			return
		}
		status, keep, err := exchange(rc, req, &ans)
		t1 := time.Now()
		counted := t1.Sub(start) >= warmup && t1.Sub(start) < end
		done.Add(1)
		code, why := "", ""
		switch {
		case err != nil:
			code, why = classifyRaw(ctx, err)
			keep = false
		case status != 200:
			code, why = "http/"+strconv.Itoa(status), string(head(ans, 200))
		default:
			code, why = checkAnswer(ans, n, msg)
		}
		if !keep {
			rc.drop()
		}
		if code == "" {
			if counted {
				w.ok++
				w.lat.Record(t1.Sub(t0))
			}
			continue
		}
		failed.Add(1)
		if counted {
			w.failed++
			w.fail(code, why)
		}
	}
}

func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// classifyRaw names a raw request's transport failure.
func classifyRaw(ctx context.Context, err error) (code, msg string) {
	var ne net.Error
	switch {
	case ctx.Err() != nil, errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return CodeTimeout, err.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return CodeClosed, err.Error()
	}
	return CodeTransport, err.Error()
}

// exchange writes req on rc and reads the answer's status and body into
// *ans; keep is false when the connection must not carry another request.
func exchange(rc *rawConn, req []byte, ans *[]byte) (status int, keep bool, err error) {
	if _, err := rc.c.Write(req); err != nil {
		return 0, false, fmt.Errorf("write request: %w", err)
	}
	return readAnswer(rc.br, ans)
}

// readAnswer reads one HTTP/1.1 response from br: its status and its body
// (by Content-Length, chunked, or to the end of the connection) into
// *body; keep reports whether the connection may carry another request.
// 1xx responses are skipped.
func readAnswer(br *bufio.Reader, body *[]byte) (status int, keep bool, err error) {
	for {
		line, err := readLine(br)
		if err != nil {
			return 0, false, fmt.Errorf("read status line: %w", err)
		}
		proto, rest, _ := bytes.Cut(line, []byte(" "))
		code, _, _ := bytes.Cut(rest, []byte(" "))
		status, err = strconv.Atoi(string(code))
		if err != nil || len(code) != 3 || !bytes.HasPrefix(proto, []byte("HTTP/1.")) {
			return 0, false, fmt.Errorf("status line %q: not HTTP/1.x", head(line, 80))
		}
		keep = string(proto) == "HTTP/1.1"
		length, chunked := int64(-1), false
		for {
			h, err := readLine(br)
			if err != nil {
				return 0, false, fmt.Errorf("read header: %w", err)
			}
			if len(h) == 0 {
				break
			}
			k, v, ok := bytes.Cut(h, []byte(":"))
			if !ok {
				return 0, false, fmt.Errorf("header %q: no colon", head(h, 80))
			}
			v = bytes.TrimSpace(v)
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				if length, err = strconv.ParseInt(string(v), 10, 64); err != nil || length < 0 {
					return 0, false, fmt.Errorf("content-length %q", v)
				}
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = bytes.Contains(bytes.ToLower(v), []byte("chunked"))
			case bytes.EqualFold(k, []byte("Connection")):
				if bytes.EqualFold(v, []byte("close")) {
					keep = false
				}
			}
		}
		if status >= 100 && status < 200 {
			continue
		}
		*body = (*body)[:0]
		switch {
		case status == 204 || status == 304:
		case chunked:
			err = readChunked(br, body)
		case length >= 0:
			if length > maxRawAnswer {
				return status, false, fmt.Errorf("answer of %d bytes: at most %d", length, maxRawAnswer)
			}
			*body = grow(*body, int(length))
			_, err = io.ReadFull(br, *body)
		default: // to the end of the connection
			keep = false
			var buf bytes.Buffer
			_, err = buf.ReadFrom(io.LimitReader(br, maxRawAnswer))
			*body = append(*body, buf.Bytes()...)
		}
		if err != nil {
			return status, false, fmt.Errorf("read answer body: %w", err)
		}
		return status, keep, nil
	}
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// readLine reads a line ending in CRLF (or LF) without it.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("header line too long")
		}
		return nil, err
	}
	return bytes.TrimSuffix(line[:len(line)-1], []byte("\r")), nil
}

// readChunked appends a chunked body, trailers skipped, to *body.
func readChunked(br *bufio.Reader, body *[]byte) error {
	for {
		line, err := readLine(br)
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(line, []byte(";"))
		n, err := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("chunk size %q", head(line, 40))
		}
		if n == 0 {
			for { // trailers, up to the empty line
				t, err := readLine(br)
				if err != nil {
					return err
				}
				if len(t) == 0 {
					return nil
				}
			}
		}
		if int64(len(*body))+n > maxRawAnswer {
			return fmt.Errorf("answer beyond %d bytes", maxRawAnswer)
		}
		at := len(*body)
		*body = append(*body, make([]byte, n)...)
		if _, err := io.ReadFull(br, (*body)[at:]); err != nil {
			return err
		}
		if crlf, err := readLine(br); err != nil || len(crlf) != 0 {
			return fmt.Errorf("chunk of %d bytes not followed by CRLF", n)
		}
	}
}

// checkAnswer checks a 200 answer to call id whose message was msg; it
// returns no code when the answer is ok. The answer is a JSON-RPC
// response, or an SSE stream whose data lines hold one.
func checkAnswer(ans []byte, id uint64, msg []byte) (code, why string) {
	js := ans
	if d, ok := sseData(ans); ok {
		js = d
	}
	// The form every server measured here writes, checked without a decode.
	var pre [64]byte
	p := append(pre[:0], `{"jsonrpc":"2.0","id":`...)
	p = strconv.AppendUint(p, id, 10)
	p = append(p, `,"result":{`...)
	if bytes.HasPrefix(js, p) && !bytes.Contains(js, []byte(`"isError":true`)) && echoes(js, msg) {
		return "", ""
	}
	return judge(js, id, msg)
}

// echoes reports whether js holds msg as a JSON string or as one inside a
// JSON string's JSON.
func echoes(js, msg []byte) bool {
	for i := 0; ; {
		j := bytes.Index(js[i:], msg)
		if j < 0 {
			return false
		}
		at, after := i+j, i+j+len(msg)
		quoted := at > 0 && js[at-1] == '"'
		if quoted && after < len(js) && js[after] == '"' { // "msg"
			return true
		}
		if quoted && at > 1 && js[at-2] == '\\' && after+1 < len(js) && js[after] == '\\' && js[after+1] == '"' { // \"msg\"
			return true
		}
		i = after
	}
}

// sseData returns the data of the first "message" event of an SSE
// answer; ok is false when ans is not one.
func sseData(ans []byte) ([]byte, bool) {
	s := bytes.TrimLeft(ans, " \t\r\n")
	if len(s) == 0 || s[0] == '{' || s[0] == '[' {
		return nil, false
	}
	var data []byte
	for line := range bytes.Lines(s) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if data != nil {
				return data, true
			}
			continue
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, d...)
		}
	}
	return data, data != nil
}

// judge decodes an answer the quick check did not pass and names what is
// wrong with it, or nothing when it is a right answer written otherwise.
func judge(js []byte, id uint64, msg []byte) (code, why string) {
	var a struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result"`
		Error   *struct {
			Code    int             `json:"code"`
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(js, &a); err != nil || a.JSONRPC != "2.0" {
		return CodeBadAnswer, "not a JSON-RPC response: " + string(head(js, 200))
	}
	if got, err := strconv.ParseUint(string(a.ID), 10, 64); err != nil || got != id {
		return CodeBadAnswer, fmt.Sprintf("id %s, want %d", a.ID, id)
	}
	if a.Error != nil {
		code := fmt.Sprintf("jsonrpc %d", a.Error.Code)
		var env struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(a.Error.Data, &env) == nil && env.Code != "" {
			code += " " + env.Code
		}
		return code, a.Error.Message
	}
	if len(a.Result) == 0 || string(a.Result) == "null" {
		return CodeBadAnswer, "neither result nor error: " + string(head(js, 200))
	}
	var r mcp.CallToolResult
	if err := json.Unmarshal(a.Result, &r); err != nil {
		return CodeBadAnswer, "result: " + err.Error()
	}
	if r.IsError {
		return classifyResult(&r)
	}
	var v any
	if json.Unmarshal(a.Result, &v) == nil && holds(v, string(msg)) {
		return "", ""
	}
	return CodeNoEcho, fmt.Sprintf("no %q in %s", msg, head(a.Result, 200))
}

// holds reports whether a decoded JSON value has msg as a string, or in a
// string that is JSON holding it.
func holds(v any, msg string) bool {
	switch v := v.(type) {
	case string:
		if v == msg {
			return true
		}
		var inner any
		return strings.Contains(v, msg) && json.Unmarshal([]byte(v), &inner) == nil && holds(inner, msg)
	case []any:
		for _, e := range v {
			if holds(e, msg) {
				return true
			}
		}
	case map[string]any:
		for _, e := range v {
			if holds(e, msg) {
				return true
			}
		}
	}
	return false
}
