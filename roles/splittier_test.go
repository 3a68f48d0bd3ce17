package roles

import (
	"strings"
	"testing"

	"github.com/okso-io/okso/schemas"
)

// TestSplitTierKilled: a gateway (embedding NATS) and a device tier as
// separate processes, each with its own role's NATS credential. The
// tier is killed with SIGKILL, so it neither marks its nodes offline nor
// releases its lease: once its lease lapses the gateway takes them
// offline all the same (their calls answer E_NODE_OFFLINE), though the
// tier wrote nothing per node since they connected. A tier started
// after it marks their records offline, so that they expire.
func TestSplitTierKilled(t *testing.T) {
	bin := oksoBinary(t)
	data := t.TempDir()
	const n = 2

	gw := startProc(t, bin, "gateway", "gateway", "--data-dir", data, "--mcp-addr", "127.0.0.1:0",
		"--nats-listen", "127.0.0.1:0", "--log-level", "debug", "--log-repeats", "0") // a line per node unlisted
	l := gw.wait(msgIs("listening"))
	natsURL, _ := l["nats_url"].(string)
	mcpURL, _ := l["mcp_url"].(string)
	if !strings.HasPrefix(natsURL, "nats://") {
		t.Fatalf("gateway listening line %v", l)
	}
	tier := startProc(t, bin, "device", "device", "--data-dir", data, "--device-addr", "127.0.0.1:0",
		"--nats-url", natsURL, "--lease-ttl", "2s")
	deviceURL, _ := tier.wait(msgIs("listening"))["device_url"].(string)
	fleet := startProc(t, bin, "mock-fleet", "mock-fleet", "-n", "2", "--connect", deviceURL, "--data-dir", data)
	fleet.wait(msgIs("mock devices connected"))
	for range n {
		gw.wait(msgIs("node online"))
	}

	s := mcpSession(t, mcpURL, mintToken(t, bin, data)) // tenant demo
	list, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var echoes []string
	for _, tl := range list.Tools {
		if strings.HasPrefix(tl.Name, "sysecho-") {
			echoes = append(echoes, tl.Name)
		}
	}
	if len(echoes) != n {
		t.Fatalf("listed %d echo tools, want %d", len(echoes), n)
	}

	if err := tier.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-tier.exited
	for range n { // its lease lapsed: a tier killed marks nothing offline
		gw.wait(msgIs("device tools unlisted: its lease lapsed"))
	}
	for _, name := range echoes {
		if code := callCode(t, s, name); code != schemas.CodeNodeOffline {
			t.Errorf("call %s of a node whose tier died: %q, want E_NODE_OFFLINE", name, code)
		}
	}
	// The dead tier's records still say online; a new tier sweeps them.
	next := startProc(t, bin, "device", "device", "--data-dir", data, "--device-addr", "127.0.0.1:0",
		"--nats-url", natsURL, "--lease-ttl", "2s")
	swept := next.wait(msgIs("marked offline the nodes of tiers whose lease is gone"))
	if got, _ := swept["nodes"].(float64); got != n {
		t.Errorf("the new tier swept %v records, want %d", swept["nodes"], n)
	}
	fleet.stop()
	next.stop()
	gw.stop()
}
