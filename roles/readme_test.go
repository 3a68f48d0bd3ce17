package roles

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/certfile/certtest"
)

// readmeBlock is one ```sh block of the README, under its headings.
type readmeBlock struct {
	section, sub string // its "## " and "### " headings
	lines        []string
}

// readmeBlocks returns the README's sh blocks under the "## "+section
// heading, its subsections included, with `\`-continued lines joined and
// blank lines dropped.
func readmeBlocks(t *testing.T, section string) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks       []readmeBlock
		cur          *readmeBlock
		h2, h3, cont string
	)
	for l := range strings.Lines(string(b)) {
		l = strings.TrimRight(l, "\n")
		switch {
		case cur != nil && l == "```":
			if h2 == section {
				blocks = append(blocks, *cur)
			}
			cur = nil
		case cur != nil:
			if line, more := strings.CutSuffix(l, `\`); more {
				cont += line
			} else if l = cont + l; strings.TrimSpace(l) != "" {
				cur.lines, cont = append(cur.lines, l), ""
			}
		case l == "```sh":
			cur = &readmeBlock{section: h2, sub: h3}
		case strings.HasPrefix(l, "## "):
			h2, h3 = strings.TrimPrefix(l, "## "), ""
		case strings.HasPrefix(l, "### "):
			h3 = strings.TrimPrefix(l, "### ")
		}
	}
	return blocks
}

// readmeShell runs a README block's lines as a person would in one
// terminal per long-running command, in a fresh directory that is also
// HOME (so the default --data-dir, ~/.okso, is in it), with the okso
// under test first on PATH. A line that starts a role runs in the
// background, and the test waits for the log line that says the role is
// up; a VAR=$(...) line sets VAR for the lines after it; any other line
// must succeed within a minute.
type readmeShell struct {
	t    *testing.T
	dir  string
	path string            // PATH, the okso under test first
	subs *strings.Replacer // what cannot run here as written
	env  []string          // NAME=value: OKSO_* defaults, and VARs set by lines
}

// roleUp is the log line that says a role started in the background is
// up, the line scripts and tests wait for; "" for a command that is no
// long-running role.
func roleUp(role string) string {
	switch role {
	case "device", "gateway", "remote":
		return "listening"
	case "mock-fleet":
		return "mock devices connected"
	case "agent":
		return "agent connected"
	}
	return ""
}

var assignment = regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(.*)$`)

// prelude is the shell text before each line: the directory, PATH, HOME
// and the variables set so far.
func (sh *readmeShell) prelude() string {
	var b strings.Builder
	fmt.Fprintf(&b, "set -eu; cd %s; export HOME=%s PATH=%s", shellQuote(sh.dir), shellQuote(sh.dir), shellQuote(sh.path))
	for _, kv := range sh.env {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, " %s=%s", k, shellQuote(v))
	}
	return b.String() + "\n"
}

// run runs block's lines in turn and returns the roles it started, by
// role name (a second of one role replaces the first in the map).
func (sh *readmeShell) run(block readmeBlock) map[string]*proc {
	t := sh.t
	t.Helper()
	procs := map[string]*proc{}
	for _, raw := range block.lines {
		line := sh.subs.Replace(raw)
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		t.Logf("$ %s", line)
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "okso" && roleUp(f[1]) != "" {
			p := startProc(t, "/bin/bash", f[1], "-c", sh.prelude()+"exec "+line)
			p.wait(msgIs(roleUp(f[1])))
			procs[f[1]] = p
			continue
		}
		script := line
		m := assignment.FindStringSubmatch(line)
		if m != nil {
			script = "printf %s " + m[2]
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := exec.CommandContext(ctx, "/bin/bash", "-c", sh.prelude()+script).Output()
		cancel()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("README, %s: `%s`: %v\n%s", block.sub, raw, err, stderr)
		}
		if m != nil {
			sh.env = append(sh.env, m[1]+"="+string(out))
		}
	}
	return procs
}

// freeAddr returns a 127.0.0.1 address no process listens on now.
func freeAddr(t *testing.T) (addr, port string) {
	addr = closedAddr(t)
	_, port, _ = strings.Cut(addr, ":")
	return addr, port
}

// TestReadmeRolesRun runs the shell blocks of the README's "Roles"
// section as written, against the built okso, each role a process of its
// own, and proves what each sets up works: a split system lists and
// calls a device's tool through its gateway, and a device reaches its
// tier over TLS and mTLS. What is substituted is only what cannot run
// here as written, and is listed below: addresses (free ports on
// 127.0.0.1, also for the defaults a line relies on, set through
// OKSO_* variables), paths (/srv/... in the temp dir; HOME is the temp
// dir, so ~/.okso is in it) and the files a user brings (certificates);
// OKSO_LOG_LEVEL=debug lets the test wait for each node to be listed.
func TestReadmeRolesRun(t *testing.T) {
	bin := oksoBinary(t)
	blocks := readmeBlocks(t, "Roles")
	// Each block of the section, in order, by its first line: a new
	// block fails the test until it is run here too.
	want := []string{
		"okso device  --data-dir /srv/okso --nats-listen 127.0.0.1:4222",
		"okso nats creds --data-dir /srv/okso --role gateway > gateway.nk",
		"# once: the data dir k all members share",
		"okso device --tls-cert tier.pem --tls-key tier-key.pem --device-addr :8443",
		"okso device --tls-cert tier.pem --tls-key tier-key.pem --client-ca devices-ca.pem --device-addr :8443",
	}
	if len(blocks) != len(want) {
		t.Fatalf("the Roles section has %d sh blocks, want %d: run the new ones here", len(blocks), len(want))
	}
	for i, b := range blocks {
		if !strings.HasPrefix(b.lines[0], want[i]) {
			t.Fatalf("block %d of Roles starts %q, want %q", i, b.lines[0], want[i])
		}
	}

	dir := t.TempDir()
	mcpAddr, _ := freeAddr(t)
	deviceAddr, _ := freeAddr(t)
	natsAddr, natsPort := freeAddr(t)
	_, tlsPort := freeAddr(t)
	sh := &readmeShell{t: t, dir: dir, path: filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		subs: strings.NewReplacer(
			"/srv/", dir+"/srv/",
			"127.0.0.1:4222", natsAddr, "tier:4222", "127.0.0.1:"+natsPort, // NATS
			"127.0.0.1:8081", deviceAddr, // --connect to the default --device-addr
			":8443", ":"+tlsPort, "tier.example.com", "127.0.0.1", // the TLS tier's address
		),
		// The defaults a line relies on (127.0.0.1:8080, :8081), elsewhere;
		// and debug lines, for the gateways' "node online".
		env: []string{"OKSO_MCP_ADDR=" + mcpAddr, "OKSO_DEVICE_ADDR=" + deviceAddr, "OKSO_LOG_LEVEL=debug"},
	}
	// okso's binary is named okso on PATH, as the README writes it.
	if filepath.Base(bin) != "okso" {
		t.Fatalf("the binary under test is %s, want one named okso", bin)
	}

	// Split mode: a tier exposing its NATS, a gateway and a fleet on its
	// data dir.
	split := sh.run(blocks[0])
	token := mintToken(t, bin, dir+"/srv/okso")
	callThroughGateway(t, split["gateway"], "http://"+mcpAddr+"/mcp", token, 50)

	// A gateway on a data dir of its own, with its role's credential and
	// the signing key's public half: the first gateway stops, so that
	// this one takes its (default) address.
	split["gateway"].stop()
	other := sh.run(blocks[1])
	callThroughGateway(t, other["gateway"], "http://"+mcpAddr+"/mcp", token, 50)
	other["gateway"].stop()
	split["mock-fleet"].stop()
	split["device"].stop()

	// A member of a three-host NATS cluster: the data dir they share is
	// made as written; the member itself does not run on one machine as
	// written (the three use the same ports, each on its own host), and
	// TestClusterFailures runs such a cluster.
	var shared readmeBlock
	for _, l := range blocks[2].lines {
		if !strings.HasPrefix(l, "okso device ") {
			shared.lines = append(shared.lines, l)
		}
	}
	sh.run(shared)
	for _, f := range []string{"k/signing.key", "k/nats/creds/route.secret", "k/nats/creds/device.nk"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the cluster's shared data dir: %v", err)
		}
	}

	// TLS, and device mTLS: the files a user brings are made here (a CA,
	// the tier's certificate for 127.0.0.1, and node.pem for the node of
	// the token the README mints).
	ca := certtest.NewCA(t)
	ca.WriteCA(t, dir)
	cert, key := ca.WriteLeaf(t, dir, 2)
	rename(t, cert, filepath.Join(dir, "tier.pem"))
	rename(t, key, filepath.Join(dir, "tier-key.pem"))
	tls := sh.run(blocks[3])
	tls["agent"].stop()
	tls["device"].stop()

	devices := certtest.NewCA(t)
	if err := os.WriteFile(filepath.Join(dir, "devices-ca.pem"), devices.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cert, key = devices.WriteDevice(t, dir, "01hzx9k3m4p7q8r9s0t1v2w3xy")
	rename(t, cert, filepath.Join(dir, "node.pem"))
	rename(t, key, filepath.Join(dir, "node-key.pem"))
	mtls := sh.run(blocks[4])
	mtls["agent"].stop()
	mtls["device"].stop()
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	if err := os.Rename(from, to); err != nil {
		t.Fatal(err)
	}
}

// mintToken mints a read-only agent token of tenant demo with dataDir's key.
func mintToken(t *testing.T, bin, dataDir string) string {
	t.Helper()
	out, err := exec.Command(bin, "token", "mint", "--data-dir", dataDir).Output()
	if err != nil {
		t.Fatalf("okso token mint: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// waitLog waits until cond holds of p's log so far, looking again at
// each line p writes, for up to 30 s.
func (p *proc) waitLog(what string, cond func(log string) bool) {
	p.t.Helper()
	timeout := time.After(30 * time.Second)
	for !cond(p.log()) { // a line is in p.log() before it is sent on p.lines
		select {
		case <-p.lines:
		case <-p.exited:
			if !cond(p.log()) {
				p.t.Fatalf("%s exited (%v) before %s:\n%s", p.name, p.err, what, p.log())
			}
		case <-timeout:
			p.t.Fatalf("%s: no %s within 30 s:\n%s", p.name, what, p.log())
		}
	}
}

// callThroughGateway waits for gw to list nodes nodes (its debug line
// "node online" for each), then lists the echo tools through it and
// calls one.
func callThroughGateway(t *testing.T, gw *proc, url, token string, nodes int) {
	t.Helper()
	gw.waitLog(fmt.Sprintf("%d nodes online", nodes), func(log string) bool {
		return strings.Count(log, `"msg":"node online"`) >= nodes
	})
	s := mcpSession(t, url, token)
	echo := toolsOf(t, s, ".echo.invoke")
	if len(echo) != nodes {
		t.Fatalf("the gateway %s lists %d echo tools, want %d", url, len(echo), nodes)
	}
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo[0], Arguments: map[string]any{"message": "readme"}})
	if err != nil || res.IsError {
		t.Fatalf("call %s through %s: %v %+v", echo[0], url, err, res)
	}
}
