package tier_test

// Hostile-input tests of the device tier (issue 5). Each test drives one
// kind of abuse from raw clients, asserts the exact answer (close code,
// error frame, audit event), asserts that a well-behaved bystander device
// on the same tier keeps answering, and logs one line
//
//	HOSTILE | <input> | <observed result>
//
// so the table of the issue can be collected from `go test -v -run Hostile`.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// hostile logs one row of the hostile-input table.
func hostile(t *testing.T, input, format string, args ...any) {
	t.Helper()
	t.Logf("HOSTILE | %s | %s", input, fmt.Sprintf(format, args...))
}

// pollUntil waits until cond holds, checking it on a short tick, or fails
// after tiertest.WaitFor. It is only for states with no event to wait on
// (a count going back to its baseline).
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(tiertest.WaitFor)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: still not true after %v", what, tiertest.WaitFor)
		}
	}
}

// echoOK reports whether node answered an echo call correctly; it is
// tt.Echo for goroutines other than the test's.
func (tt *testTier) echoOK(ctx context.Context, node string) error {
	r := tt.Call(ctx, node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	if r.Err != nil {
		return r.Err
	}
	if !r.Reply.OK {
		return fmt.Errorf("reply %v", r)
	}
	var res tiertest.EchoResult
	if err := json.Unmarshal(r.Reply.Result, &res); err != nil || res.Message != "hi" || res.NodeID != node {
		return fmt.Errorf("echo result %s", r.Reply.Result)
	}
	return nil
}

// TestHostileMalformedFlood: 1,000 malformed frames sent as fast as
// possible on one socket, before auth and after announce. The tier closes
// the socket with 4400 at the first one, with exactly one error frame and
// one audit event (the others are never processed), and a bystander keeps
// answering.
func TestHostileMalformedFlood(t *testing.T) {
	const flood = 1000
	ulid := wire.NewMsgID()
	malformed := [][]byte{
		[]byte(`not json`),
		[]byte(`{}`),
		[]byte(`[1,2,3]`),
		[]byte(`{"type":"cmd_ack","msg_id":"not-a-ulid","payload":{}}`),
		[]byte(`{"type":"bogus","msg_id":"` + ulid + `","payload":{}}`),
		[]byte(`{"type":"cmd_ack","msg_id":"` + ulid + `","in_reply_to":"` + ulid + `","payload":[]}`),
		[]byte(`{"type":"cmd_ack","msg_id":"` + ulid + `","in_reply_to":"` + ulid + `","payload":{}} trailing`),
		[]byte(`{"type":"cmd_ack","msg_id":"` + ulid + `","payload":{},"extra":1}`),
		[]byte(`{"TYPE":"cmd_ack","msg_id":"` + ulid + `","in_reply_to":"` + ulid + `","payload":{}}`),
		[]byte(`{"type":"stream","type":"cmd_ack","msg_id":"` + ulid + `","in_reply_to":"` + ulid + `","payload":{}}`),
		[]byte(`{"type":"cmd_ack","msg_id":"` + ulid + `","in_reply_to":"` + ulid + `","payload":{"ok":true,"ok":false}}`),
	}
	const silent = "after announce, from a flooder that never reads (nor answers the close)"
	for _, phase := range []string{"before auth", "after auth and announce", silent} {
		t.Run(phase, func(t *testing.T) {
			tt := newTestTier(t, tier.Options{})
			bystander := tt.runEcho(t)
			var (
				rc   *rawClient
				node string
			)
			if phase == "before auth" {
				rc = tt.dial(t, nil)
				rc.recv(t, wire.TypeHello, nil)
			} else {
				node = wire.NewNodeID()
				rc, _ = tt.connectRaw(t, node)
			}
			protocol := func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionProtocol }
			duringClose := ""

			start := time.Now()
			written := make(chan int, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), tiertest.WaitFor)
				defer cancel()
				n := 0
				for i := range flood {
					// Stops at the first write the closed connection refuses.
					if rc.c.Write(ctx, websocket.MessageText, malformed[i%len(malformed)]) != nil {
						break
					}
					n++
				}
				written <- n
			}()
			if phase == silent {
				// The tier cannot count on the flooder for the close
				// handshake: the session must end on its own, within the
				// close grace (2 s), and only then does the flooder read.
				tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return protocol(e) && e.NodeID == node })
				// While the tier waits out the close grace, the node is
				// already offline: a call fails at once, it does not wait
				// for the grace or its deadline.
				r := tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
				offline := errors.Is(r.Err, nats.ErrNoResponders) ||
					(r.Err == nil && r.Reply.Error != nil && r.Reply.Error.Code == schemas.CodeNodeOffline)
				if !offline || r.Elapsed > time.Second {
					t.Errorf("call to the node while its session closes: %v; want no responders or E_NODE_OFFLINE at once", r)
				}
				duringClose = r.String()
				tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionDisconnect && e.NodeID == node })
			}
			code, frames := rc.waitClose(t)
			elapsed := time.Since(start)
			n := <-written

			if code != wire.CloseMalformed {
				t.Errorf("close code %d, want 4400", code)
			}
			if len(frames) != 1 || frames[0].Code != schemas.CodeBadRequest {
				t.Errorf("error frames %+v, want exactly one E_BAD_REQUEST", frames)
			}
			tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return protocol(e) && e.Code == "4400" && e.NodeID == node })
			if node != "" {
				// The session has ended once its disconnect is audited: no
				// later frame can be processed after that.
				tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionDisconnect && e.NodeID == node })
				if r := tt.Record(t, node); r != nil && !r.Offline() {
					t.Errorf("registry record %+v left behind by the flooded session", r)
				}
				if r := tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`); !errors.Is(r.Err, nats.ErrNoResponders) {
					t.Errorf("call to the flooded node: %v, want no responders", r)
				}
			}
			// The tier's cleanup stops the tier: every session has ended,
			// so a second violation would have been audited by now.
			ctx, cancel := context.WithTimeout(t.Context(), tiertest.WaitFor)
			defer cancel()
			pollUntil(t, "flooded session gone", func() bool { return tt.Tier.Sessions() == 1 })
			if got := tt.Audit.Count(protocol); got != 1 {
				t.Errorf("%d protocol violations audited, want exactly 1 (the first frame)", got)
			}
			if err := tt.echoOK(ctx, bystander.node); err != nil {
				t.Fatalf("bystander: %v", err)
			}
			hostile(t, "1,000 malformed frames "+phase,
				"close %d after %v with %d error frame(s) %v; %d of %d frames accepted by the socket before it closed; %d protocol_violation audited; bystander echo ok",
				code, elapsed.Round(time.Millisecond), len(frames), frameCodes(frames), n, flood, tt.Audit.Count(protocol))
			if duringClose != "" {
				hostile(t, "1,000 malformed frames "+phase+": a call to the node during the close grace", "%s", duringClose)
			}
		})
	}
}

func frameCodes(frames []wire.ErrorFrame) []string {
	var codes []string
	for _, f := range frames {
		codes = append(codes, f.Code)
	}
	return codes
}

// unauthOutcome is how one connection that never authenticates ended.
type unauthOutcome struct {
	code    websocket.StatusCode
	errors  []string // codes of the error frames before the close
	hello   bool
	elapsed time.Duration
	err     error // a failure that is no close at all
}

// neverAuthenticate dials the tier and says nothing until it is closed.
func neverAuthenticate(ctx context.Context, set *schemas.Set, url string) unauthOutcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, tiertest.WaitFor)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{wire.Subprotocol}})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		return unauthOutcome{err: fmt.Errorf("dial (HTTP %d): %w", status, err), elapsed: time.Since(start)}
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	defer c.CloseNow()
	var o unauthOutcome
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			o.elapsed = time.Since(start)
			o.code = websocket.CloseStatus(err)
			if o.code == -1 {
				o.err = fmt.Errorf("read: %w, want a close frame", err)
			}
			return o
		}
		e, err := wire.DecodeEnvelope(set, b)
		switch {
		case err != nil:
			o.err = fmt.Errorf("tier sent %s: %w", b, err)
			return o
		case e.Type == wire.TypeHello && !o.hello && len(o.errors) == 0:
			o.hello = true
		case e.Type == wire.TypeError:
			var f wire.ErrorFrame
			if err := wire.DecodePayload(e, &f); err != nil {
				o.err = fmt.Errorf("error frame %s: %w", b, err)
				return o
			}
			o.errors = append(o.errors, f.Code)
		default:
			o.err = fmt.Errorf("tier sent %s to a connection that never authenticated", b)
			return o
		}
	}
}

// TestHostileUnauthenticatedConnections: 500 connections that never
// authenticate, dialled 50 at a time, each end with 4401 at the auth
// deadline (or 4429 if the tier refuses excess attempts from one address);
// a bystander answers echo calls throughout, and nothing of the 500 stays
// behind.
func TestHostileUnauthenticatedConnections(t *testing.T) {
	const (
		conns       = 500
		parallel    = 50
		authTimeout = 300 * time.Millisecond
	)
	tt := newTestTier(t, tier.Options{AuthTimeout: authTimeout})
	bystander := tt.runEcho(t)
	tt.Echo(t, bystander.node)
	baseline := runtime.NumGoroutine()

	// The bystander is called every 150 ms (its echo allows 10 calls a
	// second) until the flood is over.
	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	callerDone := make(chan struct{})
	go func() {
		defer close(callerDone)
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			calls.Add(1)
			if err := tt.echoOK(t.Context(), bystander.node); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	outcomes := make([]unauthOutcome, conns)
	next := make(chan int)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for i := range next {
				outcomes[i] = neverAuthenticate(t.Context(), tt.Schemas, tt.URL)
			}
		})
	}
	for i := range conns {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	<-callerDone

	var n4401, n4429, other int
	var slowest time.Duration
	for i, o := range outcomes {
		slowest = max(slowest, o.elapsed)
		switch {
		case o.err != nil:
			other++
			if other <= 5 {
				t.Errorf("connection %d: %v", i, o.err)
			}
		case o.code == wire.CloseAuthFailed:
			n4401++
			if !o.hello || len(o.errors) != 1 || o.errors[0] != schemas.CodeDeadlineExceeded {
				t.Errorf("connection %d: 4401 after hello=%v, error frames %v; want hello then one E_DEADLINE_EXCEEDED", i, o.hello, o.errors)
			}
			if o.elapsed < authTimeout {
				t.Errorf("connection %d: 4401 after %v, before the %v auth deadline", i, o.elapsed, authTimeout)
			}
		case o.code == wire.CloseTooMany:
			n4429++
			if len(o.errors) != 1 || o.errors[0] != schemas.CodeRateLimited {
				t.Errorf("connection %d: 4429 after error frames %v, want one E_RATE_LIMITED", i, o.errors)
			}
		default:
			other++
			if other <= 5 {
				t.Errorf("connection %d: close %d, want 4401 or 4429", i, o.code)
			}
		}
	}
	if n4401+n4429 != conns {
		t.Errorf("%d of %d connections ended with 4401 or 4429", n4401+n4429, conns)
	}
	if f := failed.Load(); f != 0 {
		t.Errorf("bystander failed %d of %d echo calls during the flood; first: %v", f, calls.Load(), firstErr.Load())
	}
	tt.Echo(t, bystander.node)
	if n := tt.Tier.Sessions(); n != 1 {
		t.Errorf("tier has %d node sessions, want 1 (the bystander)", n)
	}
	// Every session of the 500 has ended: the goroutines are back to what
	// they were before the flood (a few may belong to timers and NATS).
	pollUntil(t, "goroutines of the 500 connections gone", func() bool {
		return runtime.NumGoroutine() <= baseline+10
	})
	hostile(t, "500 connections that never authenticate (auth timeout 300ms, 50 at a time)",
		"%d closed 4401 (hello, then E_DEADLINE_EXCEEDED), %d closed 4429, %d other; all done in %v (slowest %v); bystander %d/%d echo calls ok during the flood; goroutines back to baseline %d (now %d)",
		n4401, n4429, other, elapsed.Round(time.Millisecond), slowest.Round(time.Millisecond),
		calls.Load()-failed.Load(), calls.Load(), baseline, runtime.NumGoroutine())
}

// refusal sends an announce (or any frame) that must be refused, without
// failing if the tier closes while the frame is still being written, and
// returns the close code, the error frames and the time it took.
func refusal(t *testing.T, rc *rawClient, payload any) (websocket.StatusCode, []wire.ErrorFrame, time.Duration, int) {
	t.Helper()
	b, err := wire.Encode(wire.TypeAnnounce, "", payload)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), tiertest.WaitFor)
		defer cancel()
		werr <- rc.c.Write(ctx, websocket.MessageText, b)
	}()
	code, frames := rc.waitClose(t)
	elapsed := time.Since(start)
	if err := <-werr; err != nil {
		t.Logf("writing the %d-byte frame: %v (the tier closed first)", len(b), err)
	}
	return code, frames, elapsed, len(b)
}

// TestHostileHugeManifest: a device announcing 10,000 capabilities gets
// 4413 at the default 64 KiB frame limit, and 4400 E_MANIFEST_INVALID from
// a tier that takes 16 MiB frames (the manifest caps capabilities at 64);
// a 60-character cap_id, and one whose projected name exceeds 64
// characters, get 4400 E_MANIFEST_INVALID. 64 capabilities are accepted.
func TestHostileHugeManifest(t *testing.T) {
	caps := func(n int) []schemas.Capability {
		cs := make([]schemas.Capability, n)
		for i := range cs {
			cs[i] = tiertest.EchoCap("c"+strconv.Itoa(i), schemas.Constraints{})
		}
		return cs
	}
	one := func(capID string) []schemas.Capability {
		return []schemas.Capability{tiertest.EchoCap(capID, schemas.Constraints{})}
	}
	tests := []struct {
		name      string
		frames    int // MaxFrameBytes
		caps      []schemas.Capability
		wantClose websocket.StatusCode // 0: accepted
		wantError string
	}{
		{"10,000 capabilities, 64 KiB frames", 0, caps(10000), wire.CloseTooLarge, schemas.CodeBadRequest},
		{"10,000 capabilities, 16 MiB frames", 16 << 20, caps(10000), wire.CloseMalformed, schemas.CodeManifestInvalid},
		{"65 capabilities", 0, caps(65), wire.CloseMalformed, schemas.CodeManifestInvalid},
		{"64 capabilities (control)", 0, caps(64), 0, ""},
		{"60-character cap_id", 0, one(strings.Repeat("c", 60)), wire.CloseMalformed, schemas.CodeManifestInvalid},
		{"23-character cap_id (projection 65 > 64)", 0, one(strings.Repeat("c", 23)), wire.CloseMalformed, schemas.CodeManifestInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTestTier(t, tier.Options{MaxFrameBytes: tc.frames})
			bystander := tt.runEcho(t)
			rc := tt.dial(t, nil)
			var hello wire.Hello
			rc.recv(t, wire.TypeHello, &hello)
			if want := max(tc.frames, wire.DefaultMaxFrameBytes); hello.MaxFrameBytes != want {
				t.Errorf("hello max_frame_bytes %d, want %d", hello.MaxFrameBytes, want)
			}
			node := wire.NewNodeID()
			rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.Token(t, node)})
			rc.recv(t, wire.TypeAuthOK, nil)

			if tc.wantClose == 0 {
				ok := rc.announce(t, node, tc.caps...)
				if len(ok.Tools) != len(tc.caps) {
					t.Fatalf("announce_ok with %d tools, want %d", len(ok.Tools), len(tc.caps))
				}
				last := tiertest.Tool(node, tc.caps[len(tc.caps)-1].CapID)
				res := tt.GoCall(t.Context(), node, tiertest.Tenant, last, `{"message":"hi"}`)
				e := rc.recv(t, wire.TypeCmd, nil)
				out, _ := json.Marshal(tiertest.EchoResult{Message: "hi", NodeID: node})
				rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: out})
				tiertest.WantOK(t, <-res)
				tt.Echo(t, bystander.node)
				hostile(t, "announce "+tc.name, "accepted: %d tools, the 64th answers; bystander echo ok", len(ok.Tools))
				return
			}
			code, frames, elapsed, size := refusal(t, rc, manifest(node, tc.caps...))
			if code != tc.wantClose {
				t.Errorf("close code %d, want %d", code, tc.wantClose)
			}
			if len(frames) != 1 || frames[0].Code != tc.wantError {
				t.Errorf("error frames %+v, want one %s", frames, tc.wantError)
			}
			tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
				return e.Decision == bus.DecisionProtocol && e.NodeID == node && e.Code == strconv.Itoa(int(tc.wantClose))
			})
			if r := tt.Record(t, node); r != nil {
				t.Errorf("refused node has a registry record %+v", r)
			}
			tt.Echo(t, bystander.node)
			hostile(t, "announce "+tc.name, "close %d with error frame(s) %v after %v (frame %d bytes); no registry record; bystander echo ok",
				code, frameCodes(frames), elapsed.Round(time.Millisecond), size)
		})
	}
}

// TestHostileSchemaRefEscape: capabilities whose schema references point
// outside the embedded set (http://, file://, or a $ref/$schema smuggled
// into the manifest) are refused with 4400 E_MANIFEST_INVALID, and nothing
// is ever fetched: the HTTP server they name receives no request.
func TestHostileSchemaRefEscape(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/schema+json")
		_, _ = w.Write([]byte(`{"$id":"` + "http://" + r.Host + r.URL.Path + `","type":"object"}`))
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "system.echo.invoke.input@1.0.0.json")
	if err := os.WriteFile(file, []byte(`{"type":"object"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	httpRef := srv.URL + "/schemas/system.echo.invoke.input@1.0.0"
	fileRef := "file://" + file

	capMap := func(edit func(m map[string]any)) map[string]any {
		b, _ := json.Marshal(echoCapability())
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		edit(m)
		return m
	}
	tests := []struct {
		name     string
		manifest func(node string) map[string]any
	}{
		{"schema_ref http://", func(node string) map[string]any {
			return manifest(node, tiertest.EchoCap("echo", schemas.Constraints{}), withRef(httpRef))
		}},
		{"schema_ref file://", func(node string) map[string]any {
			return manifest(node, withRef(fileRef))
		}},
		{"schema_ref mcp://schemas/ with a path", func(node string) map[string]any {
			return manifest(node, withRef("mcp://schemas/../../../../"+strings.TrimPrefix(file, "/")))
		}},
		{"$ref http:// in a capability", func(node string) map[string]any {
			m := manifest(node)
			m["capabilities"] = []any{capMap(func(m map[string]any) { m["$ref"] = httpRef })}
			return m
		}},
		{"$schema and $id http:// in the manifest", func(node string) map[string]any {
			m := manifest(node, echoCapability())
			m["$schema"], m["$id"] = httpRef, srv.URL+"/manifest"
			return m
		}},
		{"input_schema file:// in a capability", func(node string) map[string]any {
			m := manifest(node)
			m["capabilities"] = []any{capMap(func(m map[string]any) { m["input_schema"] = map[string]any{"$ref": fileRef} })}
			return m
		}},
	}
	tt := newTestTier(t, tier.Options{})
	bystander := tt.runEcho(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := tt.dial(t, nil)
			node := wire.NewNodeID()
			rc.authenticate(t, tt.Token(t, node))
			code, frames, _, _ := refusal(t, rc, tc.manifest(node))
			if code != wire.CloseMalformed {
				t.Errorf("close code %d, want 4400", code)
			}
			if len(frames) != 1 || frames[0].Code != schemas.CodeManifestInvalid {
				t.Errorf("error frames %+v, want one E_MANIFEST_INVALID", frames)
			}
			tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
				return e.Decision == bus.DecisionProtocol && e.NodeID == node && e.Code == "4400"
			})
			if r := tt.Record(t, node); r != nil {
				t.Errorf("refused node has a registry record %+v", r)
			}
			tt.Echo(t, bystander.node)
			if n := hits.Load(); n != 0 {
				t.Errorf("the referenced HTTP server received %d request(s)", n)
			}
			hostile(t, "announce with "+tc.name, "close %d with error frame(s) %v; %d request(s) reached the referenced server; bystander echo ok",
				code, frameCodes(frames), hits.Load())
		})
	}
	// The gateway-facing schema set resolves nothing outside itself either.
	if tt.Schemas.Has(httpRef) || tt.Schemas.Has(fileRef) {
		t.Error("the schema set knows an external reference")
	}
	if err := tt.Schemas.ValidateJSON(httpRef, []byte(`{}`)); !errors.Is(err, schemas.ErrUnknownSchema) {
		t.Errorf("validating against %s: %v, want ErrUnknownSchema", httpRef, err)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the referenced HTTP server received %d request(s)", n)
	}
}

// withRef is the echo capability with another schema_ref (its cap_id made
// unique by the ref's length, so it can sit beside a plain echo).
func withRef(ref string) schemas.Capability {
	c := tiertest.EchoCap("ref"+strconv.Itoa(len(ref)%1000), schemas.Constraints{})
	c.SchemaRef = ref
	return c
}

// TestHostileReplayedAck: a cmd_ack replayed for a cmd already answered,
// even while another cmd is pending, and a cmd_ack for a msg_id the tier
// never sent, are dropped and audited as late_ack_dropped; the session
// stays up and the next call gets its own answer.
func TestHostileReplayedAck(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	bystander := tt.runEcho(t)
	node := wire.NewNodeID()
	rc, ok := tt.connectRaw(t, node)
	lateAck := func(id string) func(tiertest.AuditEntry) bool {
		return func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionLateAck && e.NodeID == node && e.RequestID == id
		}
	}
	result := func(msg string) json.RawMessage {
		b, _ := json.Marshal(tiertest.EchoResult{Message: msg, NodeID: node, ReceivedAtMs: time.Now().UnixMilli()})
		return b
	}
	message := func(r tiertest.CallResult) string {
		var res tiertest.EchoResult
		_ = json.Unmarshal(r.Reply.Result, &res)
		return res.Message
	}

	// Call 1, answered once.
	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"first"}`)
	cmd1 := rc.recv(t, wire.TypeCmd, nil)
	ack1, err := wire.Encode(wire.TypeCmdAck, cmd1.MsgID, wire.CmdAck{OK: true, Result: result("first")})
	if err != nil {
		t.Fatal(err)
	}
	rc.sendRaw(t, websocket.MessageText, ack1)
	r1 := <-res
	tiertest.WantOK(t, r1)
	if got := message(r1); got != "first" {
		t.Fatalf("call 1 got %q, want first", got)
	}

	// The same frame again, byte for byte.
	rc.sendRaw(t, websocket.MessageText, ack1)
	tt.Audit.Wait(t, lateAck(cmd1.MsgID))

	// An ack for a msg_id the tier never sent.
	random := wire.NewMsgID()
	rc.send(t, wire.TypeCmdAck, random, wire.CmdAck{OK: true, Result: result("forged")})
	tt.Audit.Wait(t, lateAck(random))

	// Call 2 is pending when the old ack comes a third time (now as a
	// failure): it must not complete call 2.
	res = tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"second"}`)
	cmd2 := rc.recv(t, wire.TypeCmd, nil)
	rc.send(t, wire.TypeCmdAck, cmd1.MsgID, wire.CmdAck{Error: &wire.AckError{Code: schemas.CodeInternal}})
	seen := 0
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		if lateAck(cmd1.MsgID)(e) {
			seen++
		}
		return seen == 2
	})
	select {
	case r := <-res:
		t.Fatalf("call 2 completed by a replayed ack of call 1: %v", r)
	default:
	}
	rc.send(t, wire.TypeCmdAck, cmd2.MsgID, wire.CmdAck{OK: true, Result: result("second")})
	r2 := <-res
	tiertest.WantOK(t, r2)
	if got := message(r2); got != "second" {
		t.Fatalf("call 2 got %q, want second", got)
	}

	// And a third call still works: the session is up, holds the node.
	res = tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	rc.answerEcho(t, node)
	tiertest.WantOK(t, <-res)
	if r := tt.Record(t, node); r == nil || r.SessionID != ok.SessionID {
		t.Errorf("registry record %+v, want session %s", r, ok.SessionID)
	}
	if n := tt.Audit.Count(func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionProtocol }); n != 0 {
		t.Errorf("%d protocol violations audited, want none", n)
	}
	tt.Echo(t, bystander.node)
	hostile(t, "replayed cmd_ack (same frame twice, again as a failure while another cmd is pending) and cmd_ack for an unknown ULID",
		"each dropped and audited late_ack_dropped (%d events for the node); the pending call got its own answer; session and registry record kept; next call ok; bystander echo ok",
		tt.Audit.Count(func(e tiertest.AuditEntry) bool { return e.Decision == bus.DecisionLateAck && e.NodeID == node }))
}
