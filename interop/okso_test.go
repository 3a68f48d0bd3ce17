package interop

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// tenant is the tenant of all-in-one's simulated devices and of the token
// it prints (its default).
const tenant = "demo"

// okso is one `okso all-in-one` process, started as a user starts it.
type okso struct {
	mcpURL    string // the MCP endpoint, as the banner prints it
	deviceURL string // the device tier, as the banner prints it
	natsURL   string // the exposed NATS server, as the banner prints it
	token     string // the agent token the banner prints (tools:call:read_only)
	dataDir   string
	roots     *x509.CertPool // trusted for https:// (nil: the system's)
	nodes     []string       // node ids of the simulated devices, sorted
	audit     *auditLog
	stderr    *tailBuffer
}

// startOkso starts `okso all-in-one` with mock simulated devices and the
// extra flags, on ephemeral loopback ports, reads its banner, follows its
// audit events on the NATS server it exposes, and waits until the gateway
// lists every simulated device. At the end of the test the process gets
// SIGTERM and must exit cleanly.
func startOkso(t *testing.T, mock int, extra ...string) *okso {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs okso and Node")
	}
	nodeModules(t) // every test here runs a client: fail before starting okso
	o := &okso{dataDir: t.TempDir(), stderr: &tailBuffer{}}
	o.start(t, mock, extra...)
	return o
}

// startOksoTLS is startOkso serving https:// and wss:// with a
// certificate for 127.0.0.1 of a CA made for the test, whose PEM file it
// returns.
func startOksoTLS(t *testing.T, mock int, extra ...string) (o *okso, caFile string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs okso and Node")
	}
	nodeModules(t)
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	o = &okso{dataDir: t.TempDir(), stderr: &tailBuffer{}, roots: ca.Pool()}
	o.start(t, mock, append([]string{"--tls-cert", certFile, "--tls-key", keyFile}, extra...)...)
	return o, ca.WriteCA(t, dir)
}

func (o *okso) start(t *testing.T, mock int, extra ...string) {
	t.Helper()
	args := []string{"all-in-one", "--mcp-addr", "127.0.0.1:0", "--device-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--data-dir", o.dataDir, "--mock", strconv.Itoa(mock),
		"--local-agent=false"}
	cmd := exec.Command(binary, append(args, extra...)...)
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	trace := &tailBuffer{size: 4 << 20} // a race-built okso's whole goroutine traceback
	cmd.Stderr = io.MultiWriter(o.stderr, trace)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start okso all-in-one: %v", err)
	}
	lines := make(chan string, 256) // the banner's; later lines are dropped
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if t.Failed() {
			// Where it waits, in case it is okso that did not answer.
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-exited:
				t.Logf("okso all-in-one, on SIGQUIT after the failure, waits in:\n%s", stackSummary(trace.String()))
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
				t.Errorf("okso all-in-one did not stop within 20 s of SIGQUIT")
			}
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("okso all-in-one exited with %v on SIGTERM; its log ends:\n%s", err, o.stderr)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("okso all-in-one did not stop within 20 s of SIGTERM; its log ends:\n%s", o.stderr)
		}
	})
	o.readBanner(t, lines)
	o.followAudit(t)
	o.waitListed(t, mock)
}

var jwtRe = regexp.MustCompile(`^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)

// readBanner takes the MCP endpoint, the device tier, the NATS URL and
// the agent token from the lines all-in-one prints on start. The wording
// around them may change: it keys on the labels "MCP endpoint", "device
// tier", "NATS" and "agent token"
// at the start of a line and takes the first word after the label that
// looks like the value.
func (o *okso) readBanner(t *testing.T, lines <-chan string) {
	t.Helper()
	var banner strings.Builder
	timeout := time.After(60 * time.Second)
	for o.mcpURL == "" || o.deviceURL == "" || o.natsURL == "" || o.token == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("okso all-in-one ended its output before naming the MCP endpoint, the device tier, NATS and the agent token:\n%s\nlog:\n%s",
					&banner, o.stderr)
			}
			banner.WriteString(l + "\n")
			if v := labelled(l, "MCP endpoint", "http"); v != "" { // http:// or https://
				o.mcpURL = v
			}
			if v := labelled(l, "device tier", "ws"); v != "" { // ws:// or wss://
				o.deviceURL = v
			}
			if v := labelled(l, "NATS", "nats://"); v != "" {
				o.natsURL = v
			}
			if v := labelled(l, "agent token", ""); v != "" {
				o.token = v
			}
		case <-timeout:
			t.Fatalf("okso all-in-one: no MCP endpoint, device tier, NATS and agent token in its banner after 60 s:\n%s\nlog:\n%s",
				&banner, o.stderr)
		}
	}
}

// labelled returns the value of a banner line that starts with label: its
// first word with the given prefix, or (prefix "") the first that is a JWT.
func labelled(line, label, prefix string) string {
	l := strings.TrimSpace(line)
	if len(l) < len(label) || !strings.EqualFold(l[:len(label)], label) {
		return ""
	}
	for _, w := range strings.Fields(l[len(label):]) {
		w = strings.Trim(w, `:=,;()<>"'`)
		if prefix != "" && strings.HasPrefix(w, prefix) || prefix == "" && jwtRe.MatchString(w) {
			return w
		}
	}
	return ""
}

// mint returns an agent token of the tenant with exactly these scopes,
// from `okso token mint` with all-in-one's signing key.
func (o *okso) mint(t *testing.T, scopes ...string) string {
	t.Helper()
	return o.mintAs(t, "", scopes...)
}

// mintAs is mint for a subject of its own ("": the default of `okso token
// mint`).
func (o *okso) mintAs(t *testing.T, subject string, scopes ...string) string {
	t.Helper()
	var flags []string
	if subject != "" {
		flags = []string{"--subject", subject}
	}
	return o.mintWith(t, flags, scopes...)
}

// mintWith is mint with more flags of `okso token mint`.
func (o *okso) mintWith(t *testing.T, flags []string, scopes ...string) string {
	t.Helper()
	args := append([]string{"token", "mint", "--data-dir", o.dataDir, "--tenant", tenant, "--scope", strings.Join(scopes, " ")}, flags...)
	out, err := exec.Command(binary, args...).Output()
	if err != nil {
		t.Fatalf("okso token mint --scope %q: %v %s", scopes, err, stderrOf(err))
	}
	tok := strings.TrimSpace(string(out))
	if !jwtRe.MatchString(tok) {
		t.Fatalf("okso token mint printed %q, not a token", out)
	}
	return tok
}

// waitListed lists the tools with the Go SDK's client until the gateway
// lists the echo tool of mock nodes, and keeps their ids.
func (o *okso) waitListed(t *testing.T, mock int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: o.roots}}
	defer tr.CloseIdleConnections()
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-interop-wait", Version: "1"}, nil)
	s, err := c.Connect(ctx, &sdk.StreamableClientTransport{
		Endpoint:   o.mcpURL,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: o.token, Base: tr}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect the Go SDK client to %s: %v", o.mcpURL, err)
	}
	defer s.Close()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		var nodes []string
		for tool, err := range s.Tools(ctx, nil) {
			if err != nil {
				t.Fatalf("tools/list while waiting for %d nodes: %v\nlog:\n%s", mock, err, o.stderr)
			}
			if n, ok := echoNode(tool.Name); ok {
				nodes = append(nodes, n)
			}
		}
		if len(nodes) >= mock {
			slices.Sort(nodes)
			o.nodes = nodes
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the gateway lists %d of %d simulated devices after 2 min\nlog:\n%s", len(nodes), mock, o.stderr)
		case <-poll.C:
		}
	}
}

// echoNode returns the node id of a listed name sysecho-<node>-echo-invoke
// (or, in the seed form, sysecho.<node>.echo.invoke). A test may read a
// listed name; okso never parses one.
func echoNode(name string) (string, bool) {
	parts := strings.FieldsFunc(name, func(r rune) bool { return r == '.' || r == '-' })
	if len(parts) != 4 || parts[0] != "sysecho" || parts[2] != "echo" || parts[3] != "invoke" {
		return "", false
	}
	return parts[1], true
}

// followAudit subscribes to the tenant's audit events on the NATS server
// all-in-one exposes, as an operator's audit pipeline does: with the
// audit role's credential.
func (o *okso) followAudit(t *testing.T) {
	t.Helper()
	seed := filepath.Join(bus.CredentialsDir(o.dataDir), bus.SeedFileName(bus.RoleAudit))
	nc, err := bus.ConnectURL(o.natsURL, "okso-interop-audit", bus.ClientOptions{Role: bus.RoleAudit, NkeyFile: seed})
	if err != nil {
		t.Fatalf("connect to all-in-one's NATS %s: %v", o.natsURL, err)
	}
	t.Cleanup(nc.Close) // before the process stops: no reconnect attempts
	o.audit = &auditLog{changed: make(chan struct{})}
	if _, err := nc.Subscribe(bus.Audit(tenant), o.audit.add); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// auditLog keeps every audit event seen. It is safe for concurrent use.
type auditLog struct {
	mu      sync.Mutex
	events  []bus.AuditEvent
	changed chan struct{} // closed and replaced on every event
}

func (a *auditLog) add(m *nats.Msg) {
	var e bus.AuditEvent
	if json.Unmarshal(m.Data, &e) != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
	close(a.changed)
	a.changed = make(chan struct{})
}

// wait returns the first event, seen already or to come within timeout,
// for which match holds.
func (a *auditLog) wait(timeout time.Duration, match func(bus.AuditEvent) bool) (bus.AuditEvent, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	seen := 0
	for {
		a.mu.Lock()
		events, changed := a.events[seen:], a.changed
		seen = len(a.events)
		a.mu.Unlock()
		for _, e := range events {
			if match(e) {
				return e, true
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			return bus.AuditEvent{}, false
		}
	}
}

// streamClosed matches the event that ends the stream of a call whose
// request id is id.
func streamClosed(id string) func(bus.AuditEvent) bool {
	return func(e bus.AuditEvent) bool { return e.RequestID == id && e.Decision == "stream_closed" }
}

// tailBuffer keeps the last size bytes written to it (32 KiB when 0: the
// end of a log). It is safe for concurrent use.
type tailBuffer struct {
	size  int
	mu    sync.Mutex
	buf   []byte
	wrote chan struct{} // closed and replaced at every write (waitFor)
}

// waitFor waits until cond holds of what the buffer keeps, looking again
// at every write, for up to timeout.
func (b *tailBuffer) waitFor(t *testing.T, what string, timeout time.Duration, cond func(string) bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		b.mu.Lock()
		if b.wrote == nil {
			b.wrote = make(chan struct{})
		}
		wrote, text := b.wrote, string(b.buf)
		b.mu.Unlock()
		if cond(text) {
			return
		}
		select {
		case <-wrote:
		case <-deadline:
			t.Fatalf("%s: not within %v", what, timeout)
		}
	}
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.wrote != nil {
		close(b.wrote)
		b.wrote = nil
	}
	b.buf = append(b.buf, p...)
	size := cmp.Or(b.size, 32<<10)
	if len(b.buf) > size {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-size:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// stderrOf returns what a command that failed wrote on stderr, if kept.
func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}
