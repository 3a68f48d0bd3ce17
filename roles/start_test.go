package roles

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// natsWithoutJetStream starts a NATS server with no JetStream, until the
// test ends, and returns its URL.
func natsWithoutJetStream(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS without JetStream not ready")
	}
	return ns.ClientURL()
}

// TestStartFailsLoudly runs each role, as a process, with a start it
// cannot make: each exits non-zero within 15 s, its last line on stderr
// saying why. The 15 s bound is about hanging, not speed: a process
// still running after 20 s is killed and the case fails.
func TestStartFailsLoudly(t *testing.T) {
	bin := oksoBinary(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() }) // after the parallel subtests
	inUse := taken.Addr().String()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	noJetStream := natsWithoutJetStream(t)
	deadRoutes := "nats-route://" + closedAddr(t) + ",nats-route://" + closedAddr(t)
	const inUseErr = "bind: address already in use"
	badRemotes := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(badRemotes, []byte("upstreams:\n  - name: web\n    transport: ftp\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	gateway := []string{"gateway", "--mcp-addr", "127.0.0.1:0"}
	tier := []string{"device", "--device-addr", "127.0.0.1:0"}
	allInOne := []string{"all-in-one", "--mcp-addr", "127.0.0.1:0", "--device-addr", "127.0.0.1:0", "--mock", "0",
		"--local-agent=false"}
	with := func(role []string, args ...string) []string { return append(append([]string{}, role...), args...) }
	for _, tc := range []struct {
		name string
		args []string // --data-dir, a fresh one, unless given
		want []string // in the last line of stderr, after "okso: "
	}{
		{"bad --nats-url", with(gateway, "--nats-url", "nats://bad host:x"), []string{"connect nats", "invalid port"}},
		{"NATS unreachable", with(gateway, "--nats-url", "nats://"+closedAddr(t)), []string{"connect nats", "no servers available"}},
		{"NATS without JetStream", with(gateway, "--nats-url", noJetStream), []string{"no JetStream on this NATS", "enable JetStream"}},
		{"JetStream never forms", with(tier, "--nats-listen", "127.0.0.1:0", "--nats-cluster", "okso",
			"--nats-cluster-addr", "127.0.0.1:0", "--nats-routes", deadRoutes), []string{"JetStream not ready within " + startTimeout.String()}},
		{"MCP port in use", with(gateway, "--mcp-addr", inUse), []string{"--mcp-addr: listen tcp", inUseErr}},
		{"device port in use", with(tier, "--device-addr", inUse), []string{"--device-addr: listen tcp", inUseErr}},
		{"all-in-one MCP port in use", with(allInOne, "--mcp-addr", inUse), []string{"--mcp-addr: listen tcp", inUseErr}},
		{"all-in-one device port in use", with(allInOne, "--device-addr", inUse), []string{"--device-addr: listen tcp", inUseErr}},
		{"NATS port in use", with(gateway, "--nats-listen", inUse), []string{"start embedded nats", inUseErr}},
		{"all-in-one NATS port in use", with(allInOne, "--nats-listen", inUse), []string{"start embedded nats", inUseErr}},
		{"NATS route port in use", with(tier, "--nats-listen", "127.0.0.1:0", "--nats-cluster", "okso",
			"--nats-cluster-addr", inUse, "--nats-routes", deadRoutes), []string{"start embedded nats", inUseErr}},
		{"debug port in use", with(gateway, "--debug-addr", inUse), []string{"--debug-addr: listen tcp", inUseErr}},
		{"metrics port in use", with(gateway, "--metrics-addr", inUse), []string{"--metrics-addr: listen tcp", inUseErr}},
		{"data dir is a file", with(gateway, "--data-dir", file), []string{file, "not a directory"}},
		{"all-in-one data dir is a file", with(allInOne, "--data-dir", file), []string{file, "not a directory"}},
		{"mock-fleet data dir is a file", []string{"mock-fleet", "--connect", "ws://" + closedAddr(t) + "/v1/device/ws",
			"--data-dir", file}, []string{file, "not a directory"}},
		{"cluster without a client listener", with(tier, "--nats-cluster", "okso", "--nats-cluster-addr", "127.0.0.1:0",
			"--nats-routes", deadRoutes), []string{"--nats-cluster-addr needs --nats-listen"}},
		{"cluster without routes", with(tier, "--nats-listen", "127.0.0.1:0", "--nats-cluster", "okso",
			"--nats-cluster-addr", "127.0.0.1:0"), []string{"--nats-cluster-addr needs --nats-routes"}},
		{"external and embedded NATS", with(gateway, "--nats-url", noJetStream, "--nats-listen", "127.0.0.1:0"),
			[]string{"--nats-url excludes --nats-listen"}},
		{"lease under a second", with(tier, "--lease-ttl", "500ms"), []string{"--lease-ttl 500ms"}},
		{"caller lease under a second", with(gateway, "--caller-lease-ttl", "500ms"), []string{"--caller-lease-ttl 500ms"}},
		{"bad log level", with(gateway, "--log-level", "loud"), []string{"--log-level"}},
		{"agent with a malformed token", []string{"agent", "--connect", "ws://" + closedAddr(t) + "/v1/device/ws",
			"--token", "garbage"}, []string{"--token"}},
		{"mock-fleet without a tier", []string{"mock-fleet"}, []string{"--connect is required"}},
		{"remote without a config", []string{"remote"}, []string{"--config", "required"}},
		{"remote with a bad config", []string{"remote", "--config", badRemotes}, []string{"--config", badRemotes + ":3", "transport"}},
		{"remote config missing", []string{"remote", "--config", file + ".nope"}, []string{"--config", "no such file"}},
		{"all-in-one with a bad config", with(allInOne, "--remotes", badRemotes), []string{"--remotes", badRemotes + ":3", "transport"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := tc.args
			if !strings.Contains(strings.Join(args, " "), "--data-dir") {
				args = append(args, "--data-dir", t.TempDir())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			start := time.Now()
			err := cmd.Run()
			took := time.Since(start)
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			t.Logf("okso %s\n  exit %d after %v: %s", strings.Join(args, " "), cmd.ProcessState.ExitCode(),
				took.Round(10*time.Millisecond), last)
			var exit *exec.ExitError
			switch {
			case ctx.Err() != nil:
				t.Fatalf("still running after 20 s, killed:\n%s", stderr.String())
			case !errors.As(err, &exit) || exit.ExitCode() == 0:
				t.Fatalf("exited with %v, want a non-zero exit code:\n%s", err, stderr.String())
			case took > 15*time.Second:
				t.Errorf("took %v to fail, want at most 15 s", took)
			}
			if !strings.HasPrefix(last, "okso: ") {
				t.Errorf("last line on stderr %q, want okso: and why", last)
			}
			for _, w := range tc.want {
				if !strings.Contains(last, w) {
					t.Errorf("last line on stderr %q does not say %q", last, w)
				}
			}
		})
	}
}
