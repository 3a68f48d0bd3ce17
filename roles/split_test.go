package roles

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// buildOnce builds the okso binary for the process tests.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "okso-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "okso")
	out, err := exec.Command("go", "build", "-race", "-o", bin, "github.com/okso-io/okso").CombinedOutput()
	if err != nil {
		return "", &exec.ExitError{Stderr: out}
	}
	return bin, nil
})

func oksoBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin, err := buildOnce()
	if err != nil {
		t.Fatalf("build okso: %v", err)
	}
	return bin
}

// proc is a running okso process whose JSON log lines the test can wait on.
// At the end of the test it is killed, unless it has exited, and reaped.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	lines  chan map[string]any
	out    strings.Builder
	mu     sync.Mutex
	exited chan struct{} // closed once the process is reaped
	err    error         // of its Wait; read after exited
}

func startProc(t *testing.T, bin, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	p := &proc{t: t, name: name, cmd: cmd, lines: make(chan map[string]any, 1024), exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case p.lines <- m:
				default:
				}
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		_ = p.cmd.Process.Kill()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%s not reaped within 10 s of SIGKILL", p.name)
		}
	})
	return p
}

// wait returns the first log line for which match holds.
func (p *proc) wait(match func(map[string]any) bool) map[string]any {
	p.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-p.lines:
			if match(m) {
				return m
			}
		case <-p.exited:
			for { // its last lines are all in p.lines by now
				select {
				case m := <-p.lines:
					if match(m) {
						return m
					}
					continue
				default:
				}
				p.t.Fatalf("%s exited (%v) before the expected log line:\n%s", p.name, p.err, p.log())
			}
		case <-timeout:
			p.t.Fatalf("%s: expected log line not seen:\n%s", p.name, p.log())
		}
	}
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if p.err != nil {
			p.t.Errorf("%s exited with %v:\n%s", p.name, p.err, p.log())
		}
	case <-time.After(20 * time.Second):
		p.t.Errorf("%s did not stop on SIGTERM", p.name)
	}
}

func msgIs(msg string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["msg"] == msg }
}

// TestSplitMode runs a device tier (exposing its embedded NATS), a
// gateway joined to it by --nats-url, and a mock fleet, as three processes.
func TestSplitMode(t *testing.T) {
	bin := oksoBinary(t)
	data := t.TempDir()
	const n = 3

	tier := startProc(t, bin, "device", "device", "--data-dir", data, "--device-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	l := tier.wait(msgIs("listening"))
	metrics := map[string]string{"tier": str(l["metrics_url"])}
	natsURL, _ := l["nats_url"].(string)
	deviceURL, _ := l["device_url"].(string)
	if !strings.HasPrefix(natsURL, "nats://") || !strings.HasPrefix(deviceURL, "ws://") {
		t.Fatalf("device role listening line %v", l)
	}

	gw := startProc(t, bin, "gateway", "gateway", "--data-dir", data, "--mcp-addr", "127.0.0.1:0",
		"--nats-url", natsURL, "--log-level", "debug", "--metrics-addr", "127.0.0.1:0")
	l = gw.wait(msgIs("listening"))
	mcpURL, _ := l["mcp_url"].(string)
	metrics["gateway"] = str(l["metrics_url"])

	fleet := startProc(t, bin, "mock-fleet", "mock-fleet", "-n", "3", "--connect", deviceURL, "--data-dir", data,
		"--metrics-addr", "127.0.0.1:0")
	metrics["mock-fleet"] = str(fleet.wait(msgIs("metrics listener"))["metrics_url"])
	fleet.wait(msgIs("mock devices connected"))
	for range n {
		gw.wait(msgIs("node online"))
	}

	token := mintToken(t, bin, data) // tenant demo
	s := mcpSession(t, mcpURL, token)
	// The dashboard's audit feed, through the gateway's own NATS
	// credential: events the tier's credential publishes reach it.
	feed := followAuditFeed(t, mcpURL, token)
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) != 4*n+3 { // echo, metrics snapshot and subscribe, pin read per node; fleet.call, fleet.nodes, okso.find_tools
		t.Fatalf("listed %d tools, want %d", len(list.Tools), 4*n+3)
	}
	for _, tl := range list.Tools {
		if !strings.HasPrefix(tl.Name, "sysecho-") {
			continue
		}
		res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: tl.Name, Arguments: map[string]any{"message": "split"}})
		if err != nil || res.IsError {
			t.Fatalf("call %s: %v %+v", tl.Name, err, res)
		}
		var out struct {
			Message string `json:"message"`
			NodeID  string `json:"node_id"`
		}
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &out)
		if out.Message != "split" || out.NodeID != nodeOf(tl) {
			t.Errorf("call %s: result %s", tl.Name, b)
		}
	}

	for _, actor := range []string{"gateway", "tier"} {
		feed.wait(t, actor+"'s event of an echo call", func(e bus.AuditEvent) bool {
			return e.Actor == actor && e.Tenant == "demo" && e.Decision == bus.DecisionAllowed && strings.HasPrefix(e.Tool, "sysecho.")
		})
	}

	// fleet.call's plan, kept in okso_plans by the gateway's credential,
	// and run by it.
	echo := map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "split"}}
	plan, e := fanOut(t, s, withArgs(echo, "dry_run", true))
	if e != nil || plan.Targeted != n || plan.PlanID == "" {
		t.Fatalf("dry run in split mode: %+v %v\n%s", plan, e, gw.log())
	}
	run, e := fanOut(t, s, withArgs(echo, "plan_id", plan.PlanID))
	if e != nil || run.Summary.OK != n {
		t.Fatalf("plan run in split mode: %+v %v\n%s", run, e, gw.log())
	}

	// Each role's /metrics, scraped and parsed as Prometheus does.
	for role, url := range metrics {
		if !strings.HasPrefix(url, "http://127.0.0.1:") {
			t.Fatalf("%s: metrics_url %q", role, url)
		}
	}
	scraped := map[string]map[string]*dto.MetricFamily{}
	for role, url := range metrics {
		scraped[role] = scrapeURL(t, url)
		if scraped[role]["process_cpu_seconds_total"] == nil {
			t.Errorf("%s: no process metrics", role)
		}
	}
	if got := counter(scraped["gateway"]["okso_gateway_calls_total"], map[string]string{"source": "device", "code": "ok"}); got < n {
		t.Errorf("gateway: device calls ok %v, want at least %d", got, n)
	}
	if g := scraped["tier"]["okso_tier_sessions"]; g == nil || g.Metric[0].GetGauge().GetValue() != n {
		t.Errorf("tier: okso_tier_sessions %v, want %d", g, n)
	}
	for role, families := range scraped {
		for _, f := range families {
			for _, m := range f.Metric {
				for _, lb := range m.Label {
					if schemas.ValidNodeID(lb.GetValue()) {
						t.Errorf("%s: %s names a node: %v", role, f.GetName(), m.Label)
					}
				}
			}
		}
	}

	fleet.stop()
	for range n {
		gw.wait(msgIs("device tools unlisted: disconnected"))
	}
	gw.stop()
	tier.stop()
}

// scrapeURL is scrape over a role's own listener.
func scrapeURL(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("%s does not parse: %v", url, err)
	}
	return families
}

// TestAllInOneSignal: all-in-one stops cleanly on SIGTERM, and its own
// devices (the mock fleet, this host's agent) do not take the stop for
// their tier going away.
func TestAllInOneSignal(t *testing.T) {
	bin := oksoBinary(t)
	p := startProc(t, bin, "all-in-one", "all-in-one", "--data-dir", t.TempDir(),
		"--mcp-addr", "127.0.0.1:0", "--device-addr", "127.0.0.1:0", "--mock", "2")
	seen := map[any]bool{}
	for !seen["mock devices connected"] || !seen["agent connected"] {
		seen[p.wait(func(m map[string]any) bool {
			return m["msg"] == "mock devices connected" || m["msg"] == "agent connected"
		})["msg"]] = true
	}
	p.stop()
	if log := p.log(); strings.Contains(log, "device tier unreachable") {
		t.Errorf("a device of all-in-one reported an outage when it stopped:\n%s", log)
	}
}
