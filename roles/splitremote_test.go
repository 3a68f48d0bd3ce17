package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// echoUpstream is the MCP server the remote replicas federate, over
// Streamable HTTP in the test's process (it is not under test): one tool,
// echo, whose calls it counts by the X-Replica header each replica's
// config makes it send. Stopping it ends its sessions and connections, as
// a killed process would; starting it again listens on the same address
// with no session of the old one. Its methods are safe for concurrent use.
type echoUpstream struct {
	t    *testing.T
	addr string // fixed by the first start; the test's goroutine's alone

	mu     sync.Mutex
	calls  map[string]int // by X-Replica
	srv    *http.Server
	mcp    *sdk.Server
	served chan struct{} // closed when Serve returned
}

// startEchoUpstream serves an upstream on an ephemeral loopback port until
// the test ends.
func startEchoUpstream(t *testing.T) *echoUpstream {
	u := &echoUpstream{t: t, addr: "127.0.0.1:0", calls: map[string]int{}}
	u.start()
	t.Cleanup(u.stop)
	return u
}

func (u *echoUpstream) url() string { return "http://" + u.addr + "/mcp" }

// start serves the upstream on u.addr.
func (u *echoUpstream) start() {
	u.t.Helper()
	ln, err := net.Listen("tcp", u.addr)
	if err != nil {
		u.t.Fatalf("upstream: listen on %s: %v", u.addr, err)
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "echo-upstream", Version: "1"}, nil)
	s.AddTool(&sdk.Tool{Name: "echo", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"message":{"type":"string"}},"required":["message"]}`)},
		func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var replica string
			if req.Extra != nil {
				replica = req.Extra.Header.Get("X-Replica")
			}
			u.mu.Lock()
			u.calls[replica]++
			u.mu.Unlock()
			var args struct{ Message string }
			if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
				return nil, err
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: args.Message}}}, nil
		})
	srv := &http.Server{Handler: sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, nil)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	u.addr = ln.Addr().String()
	u.mu.Lock()
	u.srv, u.mcp, u.served = srv, s, served
	u.mu.Unlock()
}

// stop closes the listener, every connection and every session, until
// start; stopping a stopped upstream does nothing.
func (u *echoUpstream) stop() {
	u.mu.Lock()
	srv, s, served := u.srv, u.mcp, u.served
	u.srv, u.mcp = nil, nil
	u.mu.Unlock()
	if srv == nil {
		return
	}
	_ = srv.Close()
	<-served
	for ss := range s.Sessions() {
		_ = ss.Close()
	}
}

// callsBy is how many echo calls the replica named sent.
func (u *echoUpstream) callsBy(replica string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[replica]
}

// outcome is one call of the load.
type outcome struct {
	start time.Time
	took  time.Duration
	code  string // "" when the call succeeded
	err   error  // a transport or protocol error: never expected
}

// load keeps the outcome of every call the test's clients make. It is
// safe for concurrent use.
type load struct {
	mu       sync.Mutex
	outcomes []outcome
	changed  chan struct{} // closed and replaced on every outcome
}

func (l *load) add(o outcome) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.outcomes = append(l.outcomes, o)
	close(l.changed)
	l.changed = make(chan struct{})
}

// waitOK waits until n calls started at or after since have succeeded.
func (l *load) waitOK(t *testing.T, n int, since time.Time, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok, changed := 0, l.changed
		for _, o := range l.outcomes {
			if o.code == "" && o.err == nil && !o.start.Before(since) {
				ok++
			}
		}
		l.mu.Unlock()
		if ok >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%d of %d calls succeeded within %v", ok, n, timeout)
		}
	}
}

func (l *load) all() []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.outcomes)
}

// callOutcome makes one call with a client-side bound well past the
// gateway's budget, so that a call the gateway lets hang is seen as one.
func callOutcome(s *sdk.ClientSession, tool string, budget time.Duration) outcome {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), budget+5*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: map[string]any{"message": "x"}})
	o := outcome{start: start, took: time.Since(start), err: err}
	if err == nil && res.IsError {
		var e schemas.Error
		b, _ := json.Marshal(res.Meta[mcp.MetaError])
		if json.Unmarshal(b, &e) != nil || e.Code == "" {
			o.err = fmt.Errorf("an error result with no envelope: %+v", res)
		}
		o.code = e.Code
	}
	return o
}

// toolListed waits until the gateway's tools/list has tool (or has it
// no more) and returns how long that took; it fails the test past within.
func toolListed(t *testing.T, s *sdk.ClientSession, tool string, listed bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		lt, err := s.ListTools(ctx, nil)
		cancel()
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		has := slices.ContainsFunc(lt.Tools, func(tl *sdk.Tool) bool { return tl.Name == listedName(tool) })
		if has == listed {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s listed = %v after %v, want %v within %v", tool, has, time.Since(start), listed, within)
		}
		<-poll.C
	}
}

// TestSplitFederation runs federation as an operator runs it split: a
// gateway exposing its embedded NATS, and okso remote replicas joined to
// it by --nats-url, each federating the same Streamable HTTP upstream
// with a 2 s lease. Under load, the replicas share the calls; one is
// SIGKILLed, and no call outlives its budget, the few that fail are §5
// errors, the calls after it all succeed on the other, and the tool
// stays listed. The upstream killed, its tool leaves the list within the
// lease, and comes back when it listens again. Both replicas killed, the
// tool leaves the list within the lease.
func TestSplitFederation(t *testing.T) {
	bin := oksoBinary(t)
	data := t.TempDir()
	const (
		lease      = 2 * time.Second
		budget     = time.Second
		callMargin = 500 * time.Millisecond // a call's past its budget
		listMargin = time.Second            // a tool's on the list past the lease
		clients    = 8
		tool       = "up.echo"
	)
	up := startEchoUpstream(t)

	gw := startProc(t, bin, "gateway", "gateway", "--data-dir", data, "--mcp-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--budget", budget.String())
	l := gw.wait(msgIs("listening"))
	natsURL, _ := l["nats_url"].(string)
	mcpURL, _ := l["mcp_url"].(string)
	if !strings.HasPrefix(natsURL, "nats://") || !strings.HasPrefix(mcpURL, "http://") {
		t.Fatalf("gateway listening line %v", l)
	}
	// The replicas run elsewhere, with data dirs of their own: each is
	// given the remote role's NATS credential.
	seed, err := exec.Command(bin, "nats", "creds", "--data-dir", data, "--role", "remote").Output()
	if err != nil {
		t.Fatalf("okso nats creds: %v", err)
	}
	seedFile := filepath.Join(t.TempDir(), "remote.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	replica := func(name string) *proc {
		t.Helper()
		config := filepath.Join(t.TempDir(), "remotes.yaml")
		if err := os.WriteFile(config, fmt.Appendf(nil, `upstreams:
  - name: up
    transport: http
    url: %s
    headers: {X-Replica: %s}
    tenants: [demo]
    allow: [echo]
    safety: {echo: read_only}
`, up.url(), name), 0o600); err != nil {
			t.Fatal(err)
		}
		p := startProc(t, bin, name, "remote", "--config", config, "--nats-url", natsURL, "--nats-nkey", seedFile,
			"--remote-lease-ttl", lease.String(), "--data-dir", t.TempDir())
		p.wait(msgIs("upstream listed"))
		return p
	}
	doomed, survivor := replica("remote-a"), replica("remote-b")

	out, err := exec.Command(bin, "token", "mint", "--data-dir", data, "--tenant", DefaultTenant).Output()
	if err != nil {
		t.Fatalf("okso token mint: %v", err)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: clients + 1}
	t.Cleanup(tr.CloseIdleConnections)
	connect := func() *sdk.ClientSession {
		t.Helper()
		c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
		s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{
			Endpoint:   mcpURL,
			HTTPClient: &http.Client{Transport: bearer.Transport{Token: strings.TrimSpace(string(out)), Base: tr}},
			MaxRetries: -1,
		}, nil)
		if err != nil {
			t.Fatalf("connect to %s: %v", mcpURL, err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	lister := connect()
	toolListed(t, lister, tool, true, 10*time.Second)

	// Under load, one replica is killed.
	ld := &load{changed: make(chan struct{})}
	stop := make(chan struct{})
	var workers sync.WaitGroup
	for range clients {
		s := connect()
		workers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ld.add(callOutcome(s, tool, budget))
			}
		})
	}
	unlisted := make(chan time.Time, 1) // when the lister first missed the tool under load
	listerErr := make(chan error, 1)
	workers.Go(func() {
		poll := time.NewTicker(100 * time.Millisecond)
		defer poll.Stop()
		for {
			select {
			case <-stop:
				listerErr <- nil
				return
			case <-poll.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			lt, err := lister.ListTools(ctx, nil)
			cancel()
			if err != nil {
				listerErr <- err
				return
			}
			if !slices.ContainsFunc(lt.Tools, func(tl *sdk.Tool) bool { return tl.Name == listedName(tool) }) {
				select {
				case unlisted <- time.Now():
				default:
				}
			}
		}
	})
	stopLoad := sync.OnceFunc(func() { close(stop); workers.Wait() })
	t.Cleanup(stopLoad)

	ld.waitOK(t, 200, time.Time{}, 30*time.Second)
	servedB := up.callsBy("remote-b")
	killedAt := time.Now()
	if err := doomed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-doomed.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the killed replica was not reaped within 10 s")
	}
	servedA := up.callsBy("remote-a") // all told
	// The calls in flight on the killed replica end by their budget; those
	// started a budget after the kill must all reach the other.
	settled := killedAt.Add(budget)
	ld.waitOK(t, 200, settled, 30*time.Second)
	stopLoad()
	if err := <-listerErr; err != nil {
		t.Errorf("tools/list under load: %v", err)
	}
	select {
	case at := <-unlisted:
		t.Errorf("%s left tools/list %v after one of two replicas was killed", tool, at.Sub(killedAt))
	default:
	}

	var failed int
	for _, o := range ld.all() {
		switch {
		case o.err != nil:
			t.Errorf("a call started %v after the kill: %v", o.start.Sub(killedAt), o.err)
			continue
		case o.took > budget+callMargin:
			t.Errorf("a call started %v after the kill took %v, past its budget of %v", o.start.Sub(killedAt), o.took, budget)
		}
		if o.code == "" {
			continue
		}
		failed++
		if o.code != schemas.CodeDeadlineExceeded && o.code != schemas.CodeNodeOffline {
			t.Errorf("a call started %v after the kill failed with %s, want E_DEADLINE_EXCEEDED or E_NODE_OFFLINE", o.start.Sub(killedAt), o.code)
		}
		if !o.start.Before(settled) {
			t.Errorf("a call started %v after the kill failed with %s: the other replica serves it", o.start.Sub(killedAt), o.code)
		}
	}
	t.Logf("before the kill the replicas served %d and %d calls; %d calls failed around it", servedA, servedB, failed)
	if a, b := up.callsBy("remote-a"), up.callsBy("remote-b"); a != servedA || b-servedB < 200 {
		t.Errorf("once the kill settled, the killed replica served %d calls and the other %d, want none and at least 200",
			a-servedA, b-servedB)
	}
	if all := servedA + servedB; servedA < all/10 || servedB < all/10 {
		t.Errorf("the replicas served %d and %d calls before the kill: they do not share them", servedA, servedB)
	}
	if failed > 2*clients {
		t.Errorf("%d calls failed around the kill of one of two replicas, want at most the %d in flight and a few more", failed, clients)
	}

	// The upstream killed, its tool leaves the list; listening again, it
	// comes back. Two replicas serve it again first.
	third := replica("remote-c")
	up.stop()
	took := toolListed(t, lister, tool, false, lease+listMargin)
	t.Logf("the upstream stopped: %s left tools/list in %v", tool, took)
	up.start()
	took = toolListed(t, lister, tool, true, 20*time.Second)
	t.Logf("the upstream started again: %s listed again in %v", tool, took)
	survivor.wait(msgIs("upstream listed"))
	third.wait(msgIs("upstream listed"))
	if o := callOutcome(lister, tool, budget); o.err != nil || o.code != "" {
		t.Errorf("a call once the upstream is back: %+v", o)
	}

	// Both replicas killed, the lease runs out.
	for _, p := range []*proc{survivor, third} {
		if err := p.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	took = toolListed(t, lister, tool, false, lease+listMargin)
	t.Logf("both replicas killed: %s left tools/list in %v", tool, took)
	gw.stop()
}
