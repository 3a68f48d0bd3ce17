package roles

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/certfile/certtest"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// freePorts reserves n distinct loopback ports and releases them for a
// process to take (a small race, acceptable in tests).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// tally counts call outcomes by code ("ok", an error code, or "transport").
type tally struct {
	mu      sync.Mutex
	counts  map[string]int
	slowest time.Duration
	wrong   int // answers from another node than addressed
}

func (c *tally) add(code string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[code]++
	c.slowest = max(c.slowest, d)
}

func (c *tally) reset() (map[string]int, time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	counts, slowest, wrong := c.counts, c.slowest, c.wrong
	c.counts, c.slowest, c.wrong = map[string]int{}, 0, 0
	return counts, slowest, wrong
}

// callOnce calls one echo on one gateway session and classifies the result.
func callOnce(ctx context.Context, s *sdk.ClientSession, node string, c *tally) (transport bool) {
	start := time.Now()
	res, err := s.CallTool(ctx, &sdk.CallToolParams{Name: echoName(node), Arguments: map[string]any{"message": "load"}})
	d := time.Since(start)
	var rpcErr *jsonrpc.Error
	var e schemas.Error
	switch {
	case errors.As(err, &rpcErr) && json.Unmarshal(rpcErr.Data, &e) == nil && e.Code != "":
		c.add(e.Code, d) // a node not listed (yet, or any more)
	case err != nil: // the gateway is gone (the SDK reports some of that as JSON-RPC errors)
		if ctx.Err() == nil {
			c.add("transport", d)
		}
		return true
	case res.IsError:
		b, _ := json.Marshal(res.Meta[mcp.MetaError])
		_ = json.Unmarshal(b, &e)
		c.add(e.Code, d)
	default:
		b, _ := json.Marshal(res.StructuredContent)
		var out struct {
			NodeID string `json:"node_id"`
		}
		_ = json.Unmarshal(b, &out)
		if out.NodeID != node {
			c.mu.Lock()
			c.wrong++
			c.mu.Unlock()
		}
		c.add("ok", d)
	}
	return false
}

// TestClusterFailures runs okso split over a three-member NATS cluster
// formed by the embedded servers of three device tiers, with two gateways
// and a mock fleet, all as real processes; then kills a tier, a gateway
// and a NATS member (kill -9) under a steady call load through both
// gateways. No call may hang past its budget or get another node's answer,
// and every node must come back callable. NATS is secured as in
// production: TLS on client and route ports, routes authenticated with
// the route secret, every role with its own credential (the members
// share the data dir, so its credentials, made by whichever starts
// first).
func TestClusterFailures(t *testing.T) {
	bin := oksoBinary(t)
	data := t.TempDir()
	const (
		nodes  = 200
		budget = 2 * time.Second
		ttl    = 3 * time.Second
	)
	// The signing key exists before the processes start, so they share it.
	if out, err := exec.Command(bin, "token", "mint", "--data-dir", data).CombinedOutput(); err != nil {
		t.Fatalf("mint: %v %s", err, out)
	}
	certs := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, certs, 1)
	caFile := ca.WriteCA(t, certs)
	cport := freePorts(t, 3)
	route := func(i int) string { return fmt.Sprintf("nats-route://127.0.0.1:%d", cport[i]) }
	var tiers []*proc
	var natsURLs, deviceURLs []string
	for i := range 3 {
		var routes []string
		for j := range 3 {
			if j != i {
				routes = append(routes, "--nats-routes", route(j))
			}
		}
		args := append([]string{"device", "--data-dir", data, "--device-addr", "127.0.0.1:0",
			"--nats-listen", "127.0.0.1:0", "--nats-cluster", "okso", "--nats-name", fmt.Sprintf("n%d", i+1),
			"--nats-cluster-addr", fmt.Sprintf("127.0.0.1:%d", cport[i]), "--lease-ttl", ttl.String(),
			"--nats-tls-cert", certFile, "--nats-tls-key", keyFile, "--nats-ca", caFile}, routes...)
		tiers = append(tiers, startProc(t, bin, fmt.Sprintf("tier%d", i+1), args...))
	}
	for _, p := range tiers {
		l := p.wait(msgIs("listening"))
		natsURLs = append(natsURLs, l["nats_url"].(string))
		deviceURLs = append(deviceURLs, l["device_url"].(string))
	}
	all := strings.Join(natsURLs, ",")
	var gws []*proc
	var mcpURLs []string
	for i := range 2 {
		p := startProc(t, bin, fmt.Sprintf("gateway%d", i+1), "gateway", "--data-dir", data, "--mcp-addr", "127.0.0.1:0",
			"--nats-url", all, "--nats-ca", caFile, "--budget", budget.String(), "--log-level", "debug")
		gws = append(gws, p)
		mcpURLs = append(mcpURLs, p.wait(msgIs("listening"))["mcp_url"].(string))
	}
	// The fleet uses tiers 1 and 2; tier 3 holds only a NATS member.
	fleet := startProc(t, bin, "mock-fleet", "mock-fleet", "-n", fmt.Sprint(nodes), "--data-dir", data,
		"--connect", deviceURLs[0], "--connect", deviceURLs[1])
	fleet.wait(msgIs("mock devices connected"))

	tok, err := exec.Command(bin, "token", "mint", "--data-dir", data).Output()
	if err != nil {
		t.Fatal(err)
	}
	sessions := make([]*sdk.ClientSession, 2)
	for i, u := range mcpURLs {
		c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
		s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: u,
			HTTPClient: &httpClientWithToken(strings.TrimSpace(string(tok))).Client, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		sessions[i] = s
	}
	ids := listedNodes(t, sessions[0], nodes)

	// Steady load: 4 workers, random nodes, alternating gateways; a
	// transport failure on one gateway is retried on the other.
	load := &tally{counts: map[string]int{}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				node := ids[rand.N(len(ids))]
				cctx, cancel := context.WithTimeout(ctx, 3*budget)
				if callOnce(cctx, sessions[i%2], node, load) {
					callOnce(cctx, sessions[(i+1)%2], node, load)
				}
				cancel()
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	var lastCheck map[string]int // outcomes of the last all-callable check
	phase := func(name string, fault func(), recovered func() bool) {
		t.Helper()
		load.reset()
		start := time.Now()
		fault()
		deadline := time.Now().Add(90 * time.Second)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !recovered() {
			if time.Now().After(deadline) {
				counts, _, _ := load.reset()
				for _, p := range append(append([]*proc{fleet}, tiers...), gws...) {
					t.Logf("%s log (no audit):\n%s", p.name, tailLog(p.log(), 40))
				}
				t.Fatalf("%s: not recovered after 90s; last check %v; load calls %v", name, lastCheck, counts)
			}
			<-tick.C
		}
		took := time.Since(start)
		// Then a short while of normal service, to see it stays healthy.
		<-time.After(time.Second)
		counts, slowest, wrong := load.reset()
		t.Logf("%s: recovered in %v; calls %v; slowest %v", name, took.Round(10*time.Millisecond), counts, slowest)
		if wrong > 0 {
			t.Errorf("%s: %d calls got another node's answer", name, wrong)
		}
		if slowest > budget+time.Second {
			t.Errorf("%s: a call took %v, past the %v budget", name, slowest, budget)
		}
		for code := range counts {
			switch code {
			case "ok", schemas.CodeNodeOffline, schemas.CodeDeadlineExceeded, schemas.CodeToolNotFound, "transport":
			default:
				t.Errorf("%s: unexpected outcome %s", name, code)
			}
		}
	}
	allCallable := func() bool {
		c := &tally{counts: map[string]int{}}
		for _, node := range ids {
			cctx, cancel := context.WithTimeout(context.Background(), 2*budget)
			callOnce(cctx, sessions[1], node, c)
			cancel()
		}
		lastCheck = c.counts
		return c.counts["ok"] == len(ids)
	}

	phase("baseline", func() {}, func() bool { return true })
	phase("kill -9 tier1", func() { _ = tiers[0].cmd.Process.Kill() }, allCallable)
	phase("kill -9 gateway1", func() { _ = gws[0].cmd.Process.Kill() }, allCallable)
	phase("kill -9 NATS member n3 (tier3)", func() { _ = tiers[2].cmd.Process.Kill() }, allCallable)

	stop()
	wg.Wait()
	fleet.stop()
	gws[1].stop()
	tiers[1].stop()
}

// listedNodes waits until the gateway lists n echo tools and returns their
// nodes.
func listedNodes(t *testing.T, s *sdk.ClientSession, n int) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ids []string
		for tl, err := range s.Tools(t.Context(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(tl.Name, "sysecho-") {
				ids = append(ids, nodeOf(tl))
			}
		}
		if len(ids) == n {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway lists %d echo tools, want %d", len(ids), n)
		}
		<-time.After(100 * time.Millisecond)
	}
}

// tailLog returns the last n log lines that are not audit events.
func tailLog(log string, n int) string {
	var keep []string
	for _, l := range strings.Split(log, "\n") {
		if l != "" && !strings.Contains(l, `"msg":"audit"`) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep[max(0, len(keep)-n):], "\n")
}
