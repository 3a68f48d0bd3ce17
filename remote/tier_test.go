package remote_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/remote"
	"github.com/okso-io/okso/remote/internal/testupstream"
	"github.com/okso-io/okso/schemas"
)

// tierBus is an embedded NATS server with okso_remotes, and a watch of it.
type tierBus struct {
	srv     *bus.Server
	nc      *nats.Conn
	remotes *bus.Remotes
	records chan bus.RemoteEvent
}

func startTierBus(t *testing.T) *tierBus {
	t.Helper()
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect(t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	remotes, err := bus.OpenRemotes(bounded(t), nc, bus.RemotesOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b := &tierBus{srv: srv, nc: nc, remotes: remotes, records: make(chan bus.RemoteEvent, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = remotes.Watch(ctx, func(e bus.RemoteEvent) {
			select {
			case b.records <- e:
			case <-ctx.Done():
			}
		}, nil)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return b
}

// next waits for the next record of upstream (nil: it went away).
func (b *tierBus) next(t *testing.T, upstream string) *bus.Remote {
	t.Helper()
	deadline := time.After(waitLong)
	for {
		select {
		case e := <-b.records:
			if e.Upstream == upstream {
				return e.Remote
			}
		case <-deadline:
			t.Fatalf("no change of upstream %s's record within %v", upstream, waitLong)
			return nil
		}
	}
}

// runTier runs a remote tier of cfg until the test ends.
func runTier(t *testing.T, b *tierBus, cfg *remote.Config) (stop func()) {
	t.Helper()
	return runTierOn(t, b.nc, b.remotes, cfg)
}

// runTierOn runs a remote tier of cfg on its own connection nc.
func runTierOn(t *testing.T, nc *nats.Conn, remotes *bus.Remotes, cfg *remote.Config) (stop func()) {
	t.Helper()
	return runBuilt(t, newTier(t, nc, remotes, cfg, testLog(t)))
}

// newTier builds a remote tier of cfg that logs to log.
func newTier(t *testing.T, nc *nats.Conn, remotes *bus.Remotes, cfg *remote.Config, log *slog.Logger) *remote.Tier {
	t.Helper()
	tier, err := remote.New(remote.Options{NC: nc, Remotes: remotes, Config: cfg, Logger: log,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return tier
}

// runBuilt runs tier until the test ends.
func runBuilt(t *testing.T, tier *remote.Tier) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = tier.Run(ctx) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitLong):
			t.Error("the remote tier did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

func httpUpstream(name, url string, allow []string, idempotent ...string) remote.Upstream {
	return remote.Upstream{Name: name, Transport: "http", URL: url, Tenants: []string{"demo"}, Allow: allow,
		Safety: map[string]string{"*": schemas.SafetyReadOnly}, Idempotent: idempotent,
		Timeout: 5 * time.Second, Refresh: time.Minute}
}

// call requests a tool of an upstream as a gateway does, with a budget.
func call(t *testing.T, nc *nats.Conn, upstream, tool, args string, budget time.Duration, hdr ...string) bus.Reply {
	t.Helper()
	rep, err := request(nc, upstream, tool, args, budget, hdr...)
	if err != nil {
		t.Fatalf("request %s.%s: %v", upstream, tool, err)
	}
	return rep
}

// request is call, for any goroutine.
func request(nc *nats.Conn, upstream, tool, args string, budget time.Duration, hdr ...string) (bus.Reply, error) {
	body, err := bus.Call{Tool: upstream + "." + tool, Arguments: json.RawMessage(args)}.Encode()
	if err != nil {
		return bus.Reply{}, err
	}
	m := &nats.Msg{Subject: bus.RemoteCall(upstream), Data: body, Header: nats.Header{}}
	m.Header.Set(bus.HeaderRequestID, "req-1")
	m.Header.Set(bus.HeaderTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	m.Header.Set(bus.HeaderTenant, "demo")
	m.Header.Set(bus.HeaderBudgetMs, strconv.FormatInt(budget.Milliseconds(), 10))
	m.Header.Set(bus.HeaderDeadline, strconv.FormatInt(time.Now().Add(budget).UnixMilli(), 10))
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget+2*time.Second)
	defer cancel()
	resp, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return bus.Reply{}, err
	}
	return bus.DecodeReply(resp.Data)
}

func code(rep bus.Reply) string {
	if rep.Error == nil {
		return ""
	}
	return rep.Error.Code
}

// TestTierServesHTTPUpstream: the allowed tools of an upstream reach
// okso_remotes with the configured classes; calls are answered with the
// upstream's CallToolResult; what is refused is refused with the right
// code, and a late request never reaches the upstream.
func TestTierServesHTTPUpstream(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{Flaky: 1})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(u.Release)
	cfg := &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo", "count", "hang", "flaky"})}}
	runTier(t, b, cfg)

	rec := b.next(t, "up")
	if rec == nil {
		t.Fatal("no record")
	}
	var names []string
	for _, tl := range rec.Tools {
		names = append(names, tl.Name)
		if tl.Safety != schemas.SafetyReadOnly {
			t.Errorf("%s has class %q", tl.Name, tl.Safety)
		}
	}
	if want := []string{"count", "echo", "flaky", "hang"}; !slices.Equal(names, want) {
		t.Errorf("record lists %v, want %v (only the allowed tools)", names, want)
	}
	if rec.Transport != "http" || !slices.Equal(rec.Tenants, []string{"demo"}) || rec.Digest == "" {
		t.Errorf("record %+v", rec)
	}

	rep := call(t, b.nc, "up", "echo", `{"message":"hi"}`, 2*time.Second)
	var res struct {
		StructuredContent struct {
			Message string         `json:"message"`
			Meta    map[string]any `json:"meta"`
			Headers map[string]any `json:"headers"`
		} `json:"structuredContent"`
		Meta json.RawMessage `json:"_meta"`
	}
	if !rep.OK || json.Unmarshal(rep.Result, &res) != nil || res.StructuredContent.Message != "hi" {
		t.Fatalf("echo = %+v (%s)", rep, rep.Result)
	}
	if res.StructuredContent.Meta["io.okso/request_id"] != "req-1" || res.StructuredContent.Meta["traceparent"] == nil {
		t.Errorf("the upstream saw _meta %v, want the request id and traceparent", res.StructuredContent.Meta)
	}
	if res.Meta != nil {
		t.Errorf("the result carries the upstream's _meta %s", res.Meta)
	}

	if c := code(call(t, b.nc, "up", "get-env", `{}`, time.Second)); c != schemas.CodeToolNotFound {
		t.Errorf("a tool outside allow = %s, want E_TOOL_NOT_FOUND", c)
	}
	before := u.Calls("count")
	late := call(t, b.nc, "up", "count", `{}`, time.Second,
		bus.HeaderDeadline, strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10))
	if code(late) != schemas.CodeDeadlineExceeded || u.Calls("count") != before {
		t.Errorf("a late request = %+v, count %d → %d; want E_DEADLINE_EXCEEDED and no call", late, before, u.Calls("count"))
	}

	// A call that hangs ends within its budget.
	start := time.Now()
	if c := code(call(t, b.nc, "up", "hang", `{}`, 300*time.Millisecond)); c != schemas.CodeDeadlineExceeded {
		t.Errorf("hang = %s, want E_DEADLINE_EXCEEDED", c)
	}
	if d := time.Since(start); d > 300*time.Millisecond+time.Second {
		t.Errorf("hang answered after %v, budget 300ms", d)
	}

	// flaky fails once with a 503: not idempotent here, so called once.
	if c := code(call(t, b.nc, "up", "flaky", `{}`, 2*time.Second)); c != schemas.CodeNodeOffline {
		t.Errorf("flaky, not idempotent = %s, want E_NODE_OFFLINE", c)
	}
	if n := u.Calls("flaky"); n != 1 {
		t.Errorf("a non-idempotent tool was called %d times, want 1", n)
	}
}

// TestTierRetriesIdempotentOnly: a transient failure is retried for an
// idempotent tool, within the budget, and never for another.
func TestTierRetriesIdempotentOnly(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{Flaky: 1})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"flaky"}, "flaky")}})
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	rep := call(t, b.nc, "up", "flaky", `{}`, 3*time.Second)
	if !rep.OK {
		t.Fatalf("flaky, idempotent = %+v, want success after a retry", rep)
	}
	if n := u.Calls("flaky"); n != 2 {
		t.Errorf("flaky was called %d times, want 2 (one failure, one retry)", n)
	}
}

// TestTierFollowsListChanged: a tool the upstream adds reaches the
// record when the config allows it, and not otherwise; one it removes
// leaves the record, and the tier says so at warn.
func TestTierFollowsListChanged(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	log := &logged{changed: make(chan struct{})}
	runBuilt(t, newTier(t, b.nc, b.remotes,
		&remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo", "extra_*"})}}, log.logger(t)))
	if rec := b.next(t, "up"); rec == nil || len(rec.Tools) != 1 {
		t.Fatalf("first record %+v", rec)
	}
	u.AddTool("not_allowed")
	u.AddTool("extra_one")
	for {
		rec := b.next(t, "up")
		if rec == nil {
			t.Fatal("the record went away")
		}
		var names []string
		for _, tl := range rec.Tools {
			names = append(names, tl.Name)
		}
		if slices.Contains(names, "not_allowed") {
			t.Fatalf("a tool outside allow reached the record: %v", names)
		}
		if slices.Equal(names, []string{"echo", "extra_one"}) {
			break
		}
	}
	if !call(t, b.nc, "up", "extra_one", `{"message":"x"}`, 2*time.Second).OK {
		t.Error("the added tool is not callable")
	}

	u.RemoveTool("extra_one")
	b.nextListing(t, "up", "echo")
	left := log.wait(t, toolsLeftMsg, 1)[0]
	if left.level != slog.LevelWarn || left.attrs["upstream"] != "up" || left.attrs["left"] != "[extra_one]" {
		t.Errorf("the tool that left was logged %v %v, want at warn with upstream up and left [extra_one]", left.level, left.attrs)
	}
}

// toolsLeftMsg is what the tier logs when tools leave an upstream's
// record.
const toolsLeftMsg = "upstream's tools leave every list: it lists them no more, or they were refused"

// stdioUpstream is the test upstream as a stdio child that will not
// start while the file "down" exists in state.
func stdioUpstream(state string, idempotent ...string) remote.Upstream {
	argv, env := testupstream.Command(testupstream.Options{State: state})
	return remote.Upstream{Name: "kid", Transport: "stdio", Env: env,
		Command: []string{"sh", "-c", `test -e "$OKSO_TESTUPSTREAM_STATE/down" && exit 1; exec "$0"`, argv[0]},
		Tenants: []string{"demo"}, Allow: []string{"echo", "hang"}, Idempotent: idempotent,
		Safety: map[string]string{"*": schemas.SafetyReadOnly}, Timeout: 5 * time.Second, Refresh: time.Minute}
}

// killChild kills the stdio child started last with state, and returns
// its process id.
func killChild(t *testing.T, state string) int {
	t.Helper()
	pid, err := testupstream.PID(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	return pid
}

// reaped waits until the process pid is gone, not even a zombie.
func reaped(t *testing.T, pid int) {
	t.Helper()
	eventually(t, "process "+strconv.Itoa(pid)+" reaped", func() bool { return syscall.Kill(pid, 0) == syscall.ESRCH })
}

// TestTierRestartsStdio: a stdio upstream that dies and cannot be started
// again leaves the list; once it can, it is started again, and its tools
// come back and answer.
func TestTierRestartsStdio(t *testing.T) {
	b := startTierBus(t)
	state := t.TempDir()
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{stdioUpstream(state)}})
	if b.next(t, "kid") == nil {
		t.Fatal("no record")
	}
	down := filepath.Join(state, "down")
	if err := os.WriteFile(down, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pid := killChild(t, state)
	if rec := b.next(t, "kid"); rec != nil {
		t.Fatalf("after the child died for good the record is %+v, want it gone", rec)
	}
	if err := os.Remove(down); err != nil {
		t.Fatal(err)
	}
	if b.next(t, "kid") == nil {
		t.Fatal("the record did not come back")
	}
	if next, err := testupstream.PID(state); err != nil || next == pid {
		t.Errorf("child pid %d after a restart (was %d, %v)", next, pid, err)
	}
	if !call(t, b.nc, "kid", "echo", `{"message":"back"}`, 3*time.Second).OK {
		t.Error("the restarted upstream does not answer")
	}
	reaped(t, pid)
}

// TestTierRedialsStdioAtOnce: a stdio upstream whose process dies is
// started again at once, while the calls in flight on the dead one end:
// an idempotent call in flight when the child is killed, and one sent
// just after, are answered by the next child within their budget; the
// record stays all along, and every dead child is reaped.
func TestTierRedialsStdioAtOnce(t *testing.T) {
	b := startTierBus(t)
	state := t.TempDir()
	stop := runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{stdioUpstream(state, "echo", "hang")}})
	if b.next(t, "kid") == nil {
		t.Fatal("no record")
	}
	const budget = 3 * time.Second

	// In flight: the child dies under the call, which is tried again on
	// the next one.
	answered := make(chan bus.Reply, 1)
	start := time.Now()
	go func() {
		rep, err := request(b.nc, "kid", "hang", `{"ms":200}`, budget)
		if err != nil {
			rep = bus.Reply{Error: &schemas.Error{Code: "no reply: " + err.Error()}}
		}
		answered <- rep
	}()
	eventually(t, "the first child runs the call", func() bool { return testupstream.Calls(state, "hang") == 1 })
	first := killChild(t, state)
	select {
	case rep := <-answered:
		if !rep.OK {
			t.Errorf("a call in flight when its child died = %+v, want it answered by the next child", rep.Error)
		}
		if took := time.Since(start); took > budget {
			t.Errorf("answered after %v, budget %v", took, budget)
		}
	case <-time.After(budget + waitLong):
		t.Fatal("the call in flight was not answered")
	}
	if n := testupstream.Calls(state, "hang"); n != 2 {
		t.Errorf("hang called %d times, want 2 (the dead child, then the next)", n)
	}

	// Just after: the call is sent as the child dies.
	second := killChild(t, state)
	if second == first {
		t.Fatalf("the child was not started again (pid %d)", second)
	}
	start = time.Now()
	if rep := call(t, b.nc, "kid", "echo", `{"message":"next"}`, budget); !rep.OK {
		t.Errorf("a call sent as the child died = %+v, want it answered by the next child", rep.Error)
	} else if took := time.Since(start); took > budget {
		t.Errorf("answered after %v, budget %v", took, budget)
	}
	third, err := testupstream.PID(state)
	if err != nil || third == second {
		t.Errorf("child pid %d after the second death (was %d, %v)", third, second, err)
	}
	reaped(t, first)
	reaped(t, second)
drain:
	for {
		select {
		case e := <-b.records:
			if e.Upstream == "kid" && e.Remote == nil {
				t.Error("the record went away while the child was started again at once")
			}
		default:
			break drain
		}
	}
	stop()
	reaped(t, third)
}

// TestTierReplicas: two replicas serve one upstream; when one stops, the
// record stays (the other keeps it) and calls still succeed.
func TestTierReplicas(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	cfg := &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"count"})}}
	runTier(t, b, cfg)
	stop2 := runTier(t, b, cfg) // it writes the record last
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	for range 20 {
		if !call(t, b.nc, "up", "count", `{}`, 2*time.Second).OK {
			t.Fatal("a call failed with two replicas")
		}
	}
	stop2()
	for i := range 20 {
		if rep := call(t, b.nc, "up", "count", `{}`, 2*time.Second); !rep.OK {
			t.Fatalf("call %d after one replica stopped: %+v", i, rep)
		}
	}
	// The record outlives the stopped replica's release and its TTL: the
	// other replica writes it again within a third of the TTL.
	deadline := time.Now().Add(2 * b.remotes.TTL())
	for time.Now().Before(deadline) {
		select {
		case e := <-b.records:
			if e.Upstream == "up" && e.Remote == nil {
				t.Fatal("the record went away while a replica still serves the upstream")
			}
		case <-time.After(time.Until(deadline)):
		}
	}
}

// TestTierReplicaDiesUnderLoad: of two replicas serving one upstream, one
// loses its NATS connection at once, as a killed process does, while
// calls are in flight: no call hangs past its budget, and the calls that
// follow are served by the other replica.
func TestTierReplicaDiesUnderLoad(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	cfg := &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo"})}}
	doomed, err := b.srv.Connect("doomed-replica")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(doomed.Close)
	remotes, err := bus.OpenRemotes(bounded(t), doomed, bus.RemotesOptions{TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runTierOn(t, doomed, remotes, cfg)
	runTier(t, b, cfg)
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}

	const budget = 500 * time.Millisecond
	type outcome struct {
		ok   bool
		took time.Duration
	}
	results := make(chan outcome, 400)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 50 {
				if w == 0 && i == 10 {
					doomed.Close() // the replica's process is gone
				}
				start := time.Now()
				body, _ := bus.Call{Tool: "up.echo", Arguments: json.RawMessage(`{"message":"x"}`)}.Encode()
				m := &nats.Msg{Subject: bus.RemoteCall("up"), Data: body, Header: nats.Header{}}
				m.Header.Set(bus.HeaderBudgetMs, strconv.FormatInt(budget.Milliseconds(), 10))
				m.Header.Set(bus.HeaderDeadline, strconv.FormatInt(start.Add(budget).UnixMilli(), 10))
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				resp, err := b.nc.RequestMsgWithContext(ctx, m)
				cancel()
				ok := false
				if err == nil {
					rep, derr := bus.DecodeReply(resp.Data)
					ok = derr == nil && rep.OK
				}
				results <- outcome{ok, time.Since(start)}
			}
		})
	}
	wg.Wait()
	close(results)
	var n, failed int
	for r := range results {
		n++
		if !r.ok {
			failed++
		}
		if r.took > budget+250*time.Millisecond {
			t.Errorf("a call took %v, past its budget of %v", r.took, budget)
		}
	}
	t.Logf("%d of %d calls failed around the replica's death", failed, n)
	// Only the calls in flight on the dead replica, and those routed to it
	// before the server saw it go, may fail.
	if failed > 40 {
		t.Errorf("%d of %d calls failed after one of two replicas died", failed, n)
	}
	for i := range 20 {
		if rep := call(t, b.nc, "up", "echo", `{"message":"after"}`, 2*time.Second); !rep.OK {
			t.Fatalf("call %d after the replica died: %+v", i, rep)
		}
	}
}

// TestTierReplicaLosesUpstream: when one replica can no longer reach the
// upstream but another still serves it, the record stays (the first asks
// before it removes), and the tools never leave the list.
func TestTierReplicaLosesUpstream(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	// The first replica's session cannot be ended over its broken route:
	// the upstream ends it, once the tiers stopped.
	t.Cleanup(u.EndSessions)
	target, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool // the first replica's route to the upstream
	proxy := httputil.NewSingleHostReverseProxy(target)
	route := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			http.Error(w, "route down", http.StatusBadGateway)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(route.Close)
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"count"}, "count")}})
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	// The replica that will lose its route writes the record last, so a
	// release of its revision would remove it.
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", route.URL, []string{"count"}, "count")}})
	if b.next(t, "up") == nil {
		t.Fatal("no record from the second replica")
	}
	broken.Store(true)
	// Calls reach both replicas; those on the first fail over its broken
	// route, until it gives the upstream up.
	deadline := time.Now().Add(2 * b.remotes.TTL())
	for time.Now().Before(deadline) {
		_ = call(t, b.nc, "up", "count", `{}`, time.Second)
		select {
		case e := <-b.records:
			if e.Upstream == "up" && e.Remote == nil {
				t.Fatal("the record went away while a replica still serves the upstream")
			}
		default:
		}
	}
	for i := range 10 {
		if rep := call(t, b.nc, "up", "count", `{}`, 2*time.Second); !rep.OK {
			t.Fatalf("call %d, once the first replica gave up: %+v", i, rep)
		}
	}
}

// TestTierStopBoundsCalls: a stopping tier lets a call in flight finish
// for its grace, then ends it, answered E_NODE_OFFLINE, however long the
// call's own budget.
func TestTierStopBoundsCalls(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(u.Release)
	cfg := &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"hang"})}}
	tier, err := remote.New(remote.Options{NC: b.nc, Remotes: b.remotes, Config: cfg, Logger: testLog(t),
		StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = tier.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	answered := make(chan bus.Reply, 1)
	go func() { answered <- call(t, b.nc, "up", "hang", `{}`, 20*time.Second) }()
	eventually(t, "the upstream runs the call", func() bool { return u.Calls("hang") == 1 })
	start := time.Now()
	cancel()
	select {
	case rep := <-answered:
		if code(rep) != schemas.CodeNodeOffline {
			t.Errorf("a call ended by the stop = %+v, want E_NODE_OFFLINE", rep)
		}
		if d := time.Since(start); d > 200*time.Millisecond+2*time.Second {
			t.Errorf("answered %v after the stop, grace 200ms", d)
		}
	case <-time.After(waitLong):
		t.Fatal("the call was not answered after the stop")
	}
	select {
	case <-stopped:
	case <-time.After(waitLong):
		t.Fatal("the tier did not stop")
	}
}

// minRelistForTest is the tier's least time between two listings.
const minRelistForTest = time.Second

// TestTierCoalescesRelists: an upstream that says list_changed every few
// milliseconds is listed once a second at most, and the record ends with
// every tool.
func TestTierCoalescesRelists(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	inner := u.Handler()
	var lists atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			if bytes.Contains(body, []byte(`"method":"tools/list"`)) {
				lists.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo", "extra_*"})}})
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	before := lists.Load()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for ; time.Since(start) < 1500*time.Millisecond; n++ { // a chatty upstream: a change every 20 ms
		u.AddTool("extra_" + strconv.Itoa(n))
		<-tick.C
	}
	for {
		rec := b.next(t, "up")
		if rec != nil && len(rec.Tools) == n+1 {
			break
		}
	}
	listings, took := lists.Load()-before, time.Since(start)
	t.Logf("%d listings for %d list_changed in %v", listings, n, took)
	// At most one listing per second, plus the one the first change may
	// have caught at once.
	if most := int64(took/minRelistForTest) + 2; listings > most {
		t.Errorf("%d listings for %d list_changed in %v, want at most %d", listings, n, took, most)
	}
}

// countingLog is a test logger that also counts the records whose
// message is msg.
func countingLog(t *testing.T, msg string) (*slog.Logger, *atomic.Int64) {
	n := &atomic.Int64{}
	return slog.New(countingHandler{testLog(t).Handler(), msg, n}), n
}

type countingHandler struct {
	slog.Handler
	msg string
	n   *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{h.Handler.WithAttrs(as), h.msg, h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{h.Handler.WithGroup(name), h.msg, h.n}
}

// yieldMsg is what a replica logs when a newer one lists an upstream
// otherwise.
const yieldMsg = "a newer replica's list is served; this replica's config differs"

func toolsOf(rec *bus.Remote) []string {
	var names []string
	for _, tl := range rec.Tools {
		names = append(names, tl.Name)
	}
	return names
}

// nextListing waits for upstream's record to list exactly tools.
func (b *tierBus) nextListing(t *testing.T, upstream string, tools ...string) *bus.Remote {
	t.Helper()
	for {
		rec := b.next(t, upstream)
		if rec != nil && slices.Equal(toolsOf(rec), tools) {
			return rec
		}
	}
}

// TestTierReplicasDifferentConfigs: two replicas allow different tools
// of one upstream (a config being rolled out). The record is the newer
// replica's and stays so over many lease refreshes: it changes once,
// from the older replica's to the newer's, and the older says so once
// and keeps serving calls.
func TestTierReplicasDifferentConfigs(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	log, yields := countingLog(t, yieldMsg)
	runBuilt(t, newTier(t, b.nc, b.remotes,
		&remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo"})}}, log))
	first := b.nextListing(t, "up", "echo")
	runTier(t, b, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo", "count"})}})
	second := b.nextListing(t, "up", "count", "echo")
	if first.Writer == "" || second.Writer == "" || first.Writer == second.Writer || !second.WriterStarted.After(first.WriterStarted) {
		t.Errorf("writers %q (%v) then %q (%v), want two replicas, the second started later",
			first.Writer, first.WriterStarted, second.Writer, second.WriterStarted)
	}

	// Nine refreshes of each replica (a third of the 1 s lease).
	deadline := time.Now().Add(3 * b.remotes.TTL())
	var changes int
	for time.Now().Before(deadline) {
		select {
		case e := <-b.records:
			switch {
			case e.Upstream != "up":
			case e.Remote == nil:
				t.Fatal("the record went away while both replicas serve the upstream")
			case e.Remote.Digest != second.Digest:
				changes++
			}
		case <-time.After(time.Until(deadline)):
		}
	}
	if changes > 0 {
		t.Errorf("the record changed %d more times after the newer replica wrote it, want none", changes)
	}
	if n := yields.Load(); n != 1 {
		t.Errorf("the older replica said %d times that it leaves the record, want once", n)
	}
	for i := range 10 {
		if rep := call(t, b.nc, "up", "echo", `{"message":"x"}`, 2*time.Second); !rep.OK {
			t.Fatalf("call %d with two replicas: %+v", i, rep)
		}
	}
}

// TestTierReplicaTakesRecordBack: a replica that leaves a newer
// replica's record alone writes its own as soon as that record expires,
// not at its own next refresh.
func TestTierReplicaTakesRecordBack(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	// The older replica refreshes every 10 s: only the watch of the
	// newer's record can make it write within the test.
	slow, err := bus.OpenRemotes(bounded(t), b.nc, bus.RemotesOptions{TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	log, yields := countingLog(t, yieldMsg)
	older := newTier(t, b.nc, slow, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo"})}}, log)
	newer := newTier(t, b.nc, b.remotes, &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"echo", "count"})}}, testLog(t))
	stopNewer := runBuilt(t, newer)
	b.nextListing(t, "up", "count", "echo")
	runBuilt(t, older)
	eventually(t, "the older replica leaves the record alone", func() bool { return yields.Load() == 1 })

	stopNewer() // its record is left to expire, within the 1 s lease
	stopped := time.Now()
	b.nextListing(t, "up", "echo")
	if took := time.Since(stopped); took > b.remotes.TTL()+2*time.Second {
		t.Errorf("the older replica wrote its record %v after the newer stopped, lease %v", took, b.remotes.TTL())
	}
}

// TestTierServesGatewaysOnly: with Requesters, the tier serves a
// gateway's call and drops one that came any other way (another role's
// client, or JetStream made to publish there): the upstream is not
// called.
func TestTierServesGatewaysOnly(t *testing.T) {
	b := startTierBus(t)
	u := testupstream.New(testupstream.Options{})
	srv := httptest.NewServer(u.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(u.Release)
	cfg := &remote.Config{Upstreams: []remote.Upstream{httpUpstream("up", srv.URL, []string{"count"})}}
	tier, err := remote.New(remote.Options{NC: b.nc, Remotes: b.remotes, Config: cfg, Logger: testLog(t),
		Requesters: []bus.Role{bus.RoleGateway, bus.RoleRemote}})
	if err != nil {
		t.Fatal(err)
	}
	runBuilt(t, tier)
	if b.next(t, "up") == nil {
		t.Fatal("no record")
	}
	gw, err := b.srv.ConnectAs(bus.RoleGateway, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	if rep := call(t, gw, "up", "count", `{}`, 2*time.Second); !rep.OK {
		t.Fatalf("a gateway's call: %+v", rep)
	}
	if _, err := request(b.nc, "up", "count", `{}`, 300*time.Millisecond); err == nil {
		t.Error("a call with another reply subject than a gateway's was answered")
	}
	if n := u.Calls("count"); n != 1 {
		t.Errorf("the upstream was called %d times, want the gateway's once", n)
	}
}
