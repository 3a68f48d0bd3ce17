package roles

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/certfile/certtest"
	"github.com/okso-io/okso/schemas"
)

// eventually waits until cond holds, checking it on a short tick, or fails
// after a few seconds. It is for states with no event to wait on (a count
// going back to zero).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: still not true after 5s", what)
		}
	}
}

// streamProbe is a device's metrics stream handler that reports when its
// loop starts and ends, so a test can see that cancellation reaches it.
type streamProbe struct {
	started chan struct{}
	exited  chan struct{}
	frames  func(node string, i int) any // nil: valid samples
}

func newStreamProbe() *streamProbe {
	return &streamProbe{started: make(chan struct{}, 16), exited: make(chan struct{}, 16)}
}

func (p *streamProbe) handler(node string) agent.StreamHandler {
	return func(ctx context.Context, args json.RawMessage, emit func(any) error) error {
		p.started <- struct{}{}
		defer func() { p.exited <- struct{}{} }()
		tick := time.NewTicker(20 * time.Millisecond) // faster than any client asks: a test device
		defer tick.Stop()
		for i := 0; ; i++ {
			var f any = agent.MetricsSample{TsMs: time.Now().UnixMilli(), NodeID: node, CPUPct: 1,
				MemBytes: 1, MemTotalBytes: 2, DiskPct: 3}
			if p.frames != nil {
				f = p.frames(node, i)
			}
			if err := emit(f); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	}
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not happen", what)
	}
}

// streamDevice connects a device whose metrics.subscribe is probe's, and
// returns its node id and a function that disconnects it.
func (f *fixture) streamDevice(probe *streamProbe) (string, func()) {
	f.t.Helper()
	return f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		o.Streams = map[string]agent.StreamHandler{"metrics.subscribe": probe.handler(id)}
	})
}

type event struct{ name, data string }

// post sends POST /mcp/tools/call.
func (f *fixture) post(ctx context.Context, token, accept, body string, hdr ...string) *http.Response {
	f.t.Helper()
	url := strings.TrimSuffix(f.a.MCPURL(), "/mcp") + "/mcp/tools/call"
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	client := http.DefaultClient
	if f.http != nil {
		client = f.http
	}
	resp, err := client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp
}

// events parses an SSE response body until it ends.
func events(resp *http.Response) <-chan event {
	ch := make(chan event, 256)
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var e event
		for sc.Scan() {
			switch line := sc.Text(); {
			case strings.HasPrefix(line, "event: "):
				e.name = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				e.data = line[len("data: "):]
			case line == "":
				ch <- e
				e = event{}
			}
		}
	}()
	return ch
}

func next(t *testing.T, ch <-chan event) event {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("stream ended")
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
	}
	return event{}
}

func subscribeBody(node string, args string) string {
	return `{"tool":"sys.` + node + `.metrics.subscribe","arguments":` + args + `}`
}

func streamFixture(t *testing.T, edit func(*AllInOneConfig)) *fixture {
	return startAllInOne(t, 0, func(c *AllInOneConfig) {
		c.Gateway.StreamPing = 50 * time.Millisecond
		if edit != nil {
			edit(c)
		}
	})
}

// TestSSEStream: frames (checked against the frame schema, for the
// addressed node) and pings, with proxy-friendly headers; when the client
// leaves, the gateway cancels, the device stops sampling, and nothing of
// the stream is left on any side.
func TestSSEStream(t *testing.T) {
	checkSSEStream(t, streamFixture(t, nil), 1)
}

// TestSSEStreamOverHTTP2: the same over HTTPS, where clients speak
// HTTP/2 to the gateway (ALPN h2); and when the gateway stops, the stream
// ends with its close event (1000), not a reset.
func TestSSEStreamOverHTTP2(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	f := streamFixture(t, func(c *AllInOneConfig) { c.TLS = tlsFiles{Cert: certFile, Key: keyFile} })
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	f.http = &http.Client{Transport: tr}
	checkSSEStream(t, f, 2)

	probe := newStreamProbe()
	node, _ := f.streamDevice(probe)
	resp := f.post(t.Context(), f.token(auth.MintOptions{}), "text/event-stream", subscribeBody(node, `{"interval_ms":1000}`))
	ch := events(resp)
	if e := next(t, ch); e.name != "metric" && e.name != "ping" {
		t.Fatalf("first event %+v", e)
	}
	go f.stop()
	var last event
	for e := range ch {
		last = e
	}
	if last.name != "close" || !strings.Contains(last.data, `"code":1000`) {
		t.Fatalf("the stream's last event when the gateway stops: %+v, want close 1000", last)
	}
}

// checkSSEStream is TestSSEStream on f, whose gateway the client speaks
// HTTP major proto to.
func checkSSEStream(t *testing.T, f *fixture, proto int) {
	t.Helper()
	probe := newStreamProbe()
	node, _ := f.streamDevice(probe)
	gwSubs := f.a.gw.nc.NumSubscriptions()

	ctx, cancel := context.WithCancel(t.Context())
	resp := f.post(ctx, f.token(auth.MintOptions{}), "text/event-stream", subscribeBody(node, `{"interval_ms":1000}`))
	if resp.ProtoMajor != proto {
		t.Fatalf("HTTP/%d, want HTTP/%d", resp.ProtoMajor, proto)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" ||
		resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	ch := events(resp)
	wait(t, probe.started, "device stream start")
	var metrics, pings int
	for metrics < 3 || pings < 1 {
		e := next(t, ch)
		switch e.name {
		case "metric":
			metrics++
			if err := f.a.c.schemas.ValidateJSON(schemas.MetricsFrame, []byte(e.data)); err != nil {
				t.Fatalf("frame %s fails the frame schema: %v", e.data, err)
			}
			var s agent.MetricsSample
			if json.Unmarshal([]byte(e.data), &s); s.NodeID != node {
				t.Fatalf("frame of node %s on a stream of %s", s.NodeID, node)
			}
		case "ping":
			pings++
			if e.data != "{}" {
				t.Errorf("ping data %q", e.data)
			}
		default:
			t.Fatalf("unexpected event %+v", e)
		}
	}
	cancel() // the client goes away
	wait(t, probe.exited, "device stream loop end")
	eventually(t, "gateway streams closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
	eventually(t, "tier streams closed", func() bool { return f.a.tier.tier.Streams() == 0 })
	eventually(t, "gateway subscriptions released", func() bool { return f.a.gw.nc.NumSubscriptions() == gwSubs })
}

// Fixture 3 of seed 001 §9 on the real path: the device is killed
// mid-stream; the client gets close 4503 and the response ends.
func TestSSEDeviceKilled(t *testing.T) {
	f := streamFixture(t, nil)
	probe := newStreamProbe()
	node, kill := f.streamDevice(probe)
	resp := f.post(t.Context(), f.token(auth.MintOptions{}), "text/event-stream", subscribeBody(node, `{}`))
	ch := events(resp)
	for {
		e := next(t, ch)
		if e.name == "metric" {
			break
		}
		t.Logf("event %+v open=%d", e, f.a.gw.gw.Streams().Open())
	}
	kill()
	var last event
	for e := range ch {
		last = e
	}
	if last.name != "close" || last.data != `{"code":4503,"reason":"device_offline"}` {
		t.Fatalf("last event %+v, want close 4503 device_offline", last)
	}
	eventually(t, "gateway streams closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
}

// TestSSERefusals: every bad request is refused with its code before any
// device is touched.
func TestSSERefusals(t *testing.T) {
	f := streamFixture(t, nil)
	probe := newStreamProbe()
	node, _ := f.streamDevice(probe)
	tok := f.token(auth.MintOptions{})
	cases := []struct {
		name, accept, body string
		status             int
		code               string
	}{
		{"wrong accept", "application/json", subscribeBody(node, `{}`), 406, schemas.CodeBadRequest},
		{"no accept", "", subscribeBody(node, `{}`), 406, schemas.CodeBadRequest},
		{"interval 999", "text/event-stream", subscribeBody(node, `{"interval_ms":999}`), 400, schemas.CodeManifestInvalid},
		{"interval 60001", "text/event-stream", subscribeBody(node, `{"interval_ms":60001}`), 400, schemas.CodeManifestInvalid},
		{"interval string", "text/event-stream", subscribeBody(node, `{"interval_ms":"5000"}`), 400, schemas.CodeManifestInvalid},
		{"extra property", "text/event-stream", subscribeBody(node, `{"interval_ms":5000,"x":1}`), 400, schemas.CodeManifestInvalid},
		{"duplicate key", "text/event-stream", subscribeBody(node, `{"interval_ms":5000,"interval_ms":1}`), 400, schemas.CodeBadRequest},
		{"body not JSON", "text/event-stream", `{`, 400, schemas.CodeBadRequest},
		{"extra body field", "text/event-stream", `{"tool":"x","arguments":{},"y":1}`, 400, schemas.CodeBadRequest},
		{"missing tool", "text/event-stream", `{"arguments":{}}`, 400, schemas.CodeBadRequest},
		{"arguments not an object", "text/event-stream", `{"tool":"sys.` + node + `.metrics.subscribe","arguments":[1]}`, 400, schemas.CodeBadRequest},
		{"trailing data", "text/event-stream", subscribeBody(node, `{}`) + `{}`, 400, schemas.CodeBadRequest},
		{"unknown tool", "text/event-stream", subscribeBody(wire.NewNodeID(), `{}`), 404, schemas.CodeToolNotFound},
		{"missing scope", "text/event-stream", subscribeBody(node, `{}`), 403, schemas.CodeSafetyDenied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			token := tok
			if c.name == "missing scope" {
				token = f.token(auth.MintOptions{Scopes: []string{auth.ScopeDeviceConnect}})
			}
			resp := f.post(t.Context(), token, c.accept, c.body)
			defer resp.Body.Close()
			var e schemas.Error
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != c.status || e.Code != c.code {
				t.Errorf("status %d, envelope %+v (%v); want %d %s", resp.StatusCode, e, err, c.status, c.code)
			}
		})
	}
	resp := f.post(t.Context(), "", "text/event-stream", subscribeBody(node, `{}`))
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "resource_metadata") {
		t.Errorf("no token: status %d, WWW-Authenticate %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	select {
	case <-probe.started:
		t.Error("a refused request reached the device")
	default:
	}
}

// TestRESTUnary: the same endpoint answers unary tools as plain JSON.
func TestRESTUnary(t *testing.T) {
	f := streamFixture(t, nil)
	node := f.device(DefaultTenant, nil, nil)
	tok := f.token(auth.MintOptions{})
	resp := f.post(t.Context(), tok, "application/json",
		`{"tool":"`+echoName(node)+`","arguments":{"message":"rest"}}`, "X-Request-Id", "req-42")
	defer resp.Body.Close()
	var out agent.EchoResult
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 ||
		out.Message != "rest" || out.NodeID != node || resp.Header.Get("X-Request-Id") != "req-42" {
		t.Fatalf("status %d, %+v, %v, request id %q", resp.StatusCode, out, err, resp.Header.Get("X-Request-Id"))
	}
	snap := f.post(t.Context(), tok, "", `{"tool":"sys.`+node+`.metrics.snapshot","arguments":{}}`)
	defer snap.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(snap.Body).Decode(&raw); err != nil || snap.StatusCode != 200 {
		t.Fatalf("snapshot: status %d, %v", snap.StatusCode, err)
	}
	if err := f.a.c.schemas.ValidateJSON(schemas.MetricsSnapshot, raw); err != nil {
		t.Errorf("snapshot %s fails its schema: %v", raw, err)
	}
	sse := f.post(t.Context(), tok, "text/event-stream", `{"tool":"`+echoName(node)+`","arguments":{"message":"x"}}`)
	sse.Body.Close()
	if sse.StatusCode != http.StatusNotAcceptable {
		t.Errorf("unary tool with Accept: text/event-stream: status %d, want 406", sse.StatusCode)
	}
}

// TestSSEQuota: one stream more than the tenant's quota is closed with 4429.
func TestSSEQuota(t *testing.T) {
	f := streamFixture(t, func(c *AllInOneConfig) { c.Gateway.MaxStreamsPerTenant = 1 })
	probe := newStreamProbe()
	node, _ := f.streamDevice(probe)
	tok := f.token(auth.MintOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	first := events(f.post(ctx, tok, "text/event-stream", subscribeBody(node, `{}`)))
	next(t, first)
	second := events(f.post(t.Context(), tok, "text/event-stream", subscribeBody(node, `{}`)))
	if e := next(t, second); e.name != "close" || e.data != `{"code":4429,"reason":"rate_limited"}` {
		t.Fatalf("second stream: %+v, want close 4429", e)
	}
	cancel()
	eventually(t, "first stream closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })
	resp := f.post(t.Context(), tok, "text/event-stream", subscribeBody(node, `{}`))
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("third stream: status %d %s", resp.StatusCode, b)
	}
	third := events(resp)
	if e := next(t, third); e.name != "metric" {
		t.Fatalf("third stream: %+v, want a metric", e)
	}
}

// TestSSEBadFramesDropped: frames failing the frame schema, or of another
// node, never reach the client; they are counted.
func TestSSEBadFramesDropped(t *testing.T) {
	f := streamFixture(t, nil)
	probe := newStreamProbe()
	other := wire.NewNodeID()
	probe.frames = func(node string, i int) any {
		s := agent.MetricsSample{TsMs: time.Now().UnixMilli(), NodeID: node, CPUPct: 1, MemTotalBytes: 2}
		switch i {
		case 0:
			s.CPUPct = 150
		case 1:
			s.NodeID = other
		case 2:
			return map[string]any{"ts_ms": s.TsMs, "node_id": node, "note": "SECRET-FRAME"}
		}
		return s
	}
	node, _ := f.streamDevice(probe)
	ch := events(f.post(t.Context(), f.token(auth.MintOptions{}), "text/event-stream", subscribeBody(node, `{}`)))
	for range 3 {
		e := next(t, ch)
		if strings.Contains(e.data, other) || strings.Contains(e.data, `"cpu_pct":150`) || strings.Contains(e.data, "SECRET") {
			t.Fatalf("a bad frame reached the client: %s", e.data)
		}
	}
	if n := f.a.gw.gw.Streams().Dropped(); n < 3 {
		t.Errorf("dropped %d frames, want 3", n)
	}
}

// TestMCPSubscribe: over MCP, each frame is a progress notification of the
// call; a client that cancels stops the device, and a device that dies
// ends the call with a result saying 4503.
func TestMCPSubscribe(t *testing.T) {
	f := streamFixture(t, nil)
	probe := newStreamProbe()
	node, kill := f.streamDevice(probe)
	frames := make(chan string, 64)
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *sdk.ProgressNotificationClientRequest) {
			frames <- r.Params.Message
		},
	})
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: f.a.MCPURL(),
		HTTPClient: &httpClientWithToken(f.token(auth.MintOptions{})).Client, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name := "sys." + node + ".metrics.subscribe"

	// Without a progress token there is nowhere to send frames.
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: name, Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if e := envelope(t, res); e.Code != schemas.CodeBadRequest {
		t.Fatalf("no progress token: %s, want E_BAD_REQUEST", e.Code)
	}

	call := func(ctx context.Context) (chan *sdk.CallToolResult, chan error) {
		p := &sdk.CallToolParams{Name: name, Arguments: map[string]any{"interval_ms": 1000}}
		p.SetProgressToken("t1")
		rc, ec := make(chan *sdk.CallToolResult, 1), make(chan error, 1)
		go func() {
			r, err := s.CallTool(ctx, p)
			rc <- r
			ec <- err
		}()
		return rc, ec
	}
	ctx, cancel := context.WithCancel(t.Context())
	_, errc := call(ctx)
	for range 2 {
		select {
		case msg := <-frames:
			if err := f.a.c.schemas.ValidateJSON(schemas.MetricsFrame, []byte(msg)); err != nil {
				t.Fatalf("progress message %s is not a frame: %v", msg, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no progress notification")
		}
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call returned %v", err)
	}
	wait(t, probe.exited, "device stream loop end after the client cancelled")
	eventually(t, "gateway streams closed", func() bool { return f.a.gw.gw.Streams().Open() == 0 })

	resc, errc := call(t.Context())
	wait(t, probe.started, "second stream start")
	<-frames
	kill()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	r := <-resc
	var end struct {
		Code   int    `json:"code"`
		Reason string `json:"reason"`
		Frames int    `json:"frames"`
	}
	b, _ := json.Marshal(r.StructuredContent)
	if json.Unmarshal(b, &end); end.Code != bus.StreamDeviceOffline || end.Reason != "device_offline" || end.Frames < 1 || r.IsError {
		t.Errorf("result %s (isError %v), want 4503 device_offline after >= 1 frame, not an error", b, r.IsError)
	}
	if err := f.a.c.schemas.ValidateJSON(schemas.MetricsSubOutput, b); err != nil {
		t.Errorf("result %s fails the subscribe output schema: %v", b, err)
	}
}

// TestLocalAgent: all-in-one's own agent serves this host's real metrics.
func TestLocalAgent(t *testing.T) {
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.LocalAgent = true })
	f.waitNodes(DefaultTenant, 1)
	node := f.a.agent.d.NodeID()
	s := f.client(f.token(auth.MintOptions{}), "")
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: "sys." + node + ".metrics.snapshot", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("snapshot of this host: %v %+v", err, res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := f.a.c.schemas.ValidateJSON(schemas.MetricsSnapshot, b); err != nil {
		t.Errorf("host snapshot %s fails its schema: %v", b, err)
	}
}

// TestStreamWithoutListenerStops: a stream whose gateway is gone (nobody
// listens on its subject) stops at its first frames: NATS answers them "no
// responders" on the tier's inbox, and the tier tells the device to stop.
func TestStreamWithoutListenerStops(t *testing.T) {
	f := streamFixture(t, nil)
	probe := newStreamProbe()
	node, _ := f.streamDevice(probe)
	body, _ := json.Marshal(bus.Call{Tool: "sys." + node + ".metrics.subscribe", Arguments: json.RawMessage(`{"interval_ms":1000}`)})
	msg := &nats.Msg{Subject: bus.NodeCmd(node), Data: body, Header: nats.Header{
		bus.HeaderStreamID: {strings.ToLower(ulid.Make().String())}, bus.HeaderTenant: {DefaultTenant},
		bus.HeaderSubject: {"test-agent"}, bus.HeaderBudgetMs: {"5000"}}}
	// As a gateway would, whose stream it then is: the tier serves no
	// other role's request.
	gw, err := f.a.nats.connect(bus.RoleGateway, "test-gateway")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	resp, err := gw.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var rep bus.Reply
	if err := json.Unmarshal(resp.Data, &rep); err != nil || !rep.OK {
		t.Fatalf("stream not opened: %s", resp.Data)
	}
	wait(t, probe.started, "device stream started")
	wait(t, probe.exited, "device stream stopped for want of a listener")
	eventually(t, "tier streams closed", func() bool { return f.a.tier.tier.Streams() == 0 })
}
