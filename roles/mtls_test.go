package roles

import (
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// TestDeviceMTLS runs all-in-one with --client-ca: an agent presenting
// its node's certificate connects and its tools are called over HTTPS;
// a device with no certificate, or with one from another CA, fails the
// handshake; a device whose token is for another node than its
// certificate's is refused with 4403, and the tier says so.
func TestDeviceMTLS(t *testing.T) {
	dir, dataDir := t.TempDir(), t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	caFile := ca.WriteCA(t, dir)
	stdout, stderr := newLogSink(), newLogSink()
	runRoot(t, stdout, stderr, "all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--mock", "0", "--local-agent=false",
		"--tls-cert", certFile, "--tls-key", keyFile, "--client-ca", caFile)
	mcpURL, deviceURL := bannerRow(t, stdout, "MCP endpoint"), bannerRow(t, stdout, "device tier")
	token := bannerRow(t, stdout, "agent token")

	// The right certificate: the agent mints its token for the
	// certificate's node.
	node := wire.NewNodeID()
	devCert, devKey := ca.WriteDevice(t, dir, node)
	agentOut := newLogSink()
	runRoot(t, agentOut, agentOut, "agent", "--connect", deviceURL, "--data-dir", dataDir,
		"--ca", caFile, "--client-cert", devCert, "--client-key", devKey)
	agentOut.wait(t, "the agent with its certificate connected", line("agent connected", "node_id", node))
	s, err := tlsSession(t, mcpURL, token, ca.Pool())
	if err != nil {
		t.Fatal(err)
	}
	echoes := toolsOf(t, s, ".echo.invoke")
	if len(echoes) != 1 || !strings.Contains(echoes[0], node[len(node)-6:]) {
		t.Fatalf("echo tools %v, want the agent's (node %s)", echoes, node)
	}
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoes[0], Arguments: map[string]any{"message": "mtls"}})
	if err != nil || res.IsError {
		t.Fatalf("echo over mTLS: %v %+v", err, res)
	}

	ended := func(want string) func(map[string]any) bool {
		return func(m map[string]any) bool {
			err, _ := m["err"].(string)
			return m["msg"] == "device session ended" && strings.Contains(err, want)
		}
	}
	// No certificate: the handshake fails.
	noCert := newLogSink()
	runRoot(t, noCert, noCert, "mock-fleet", "-n", "1", "--data-dir", dataDir, "--connect", deviceURL,
		"--ca", caFile, "--log-level", "debug")
	noCert.wait(t, "a device without a certificate refused at the handshake", ended("tls: certificate required"))

	// A certificate of another CA: the handshake fails.
	other := certtest.NewCA(t)
	strange := wire.NewNodeID()
	otherCert, otherKey := other.WriteDevice(t, t.TempDir(), strange)
	otherOut := newLogSink()
	runRoot(t, otherOut, otherOut, "mock-fleet", "-n", "1", "--data-dir", dataDir, "--connect", deviceURL,
		"--ca", caFile, "--client-cert", otherCert, "--client-key", otherKey, "--log-level", "debug")
	otherOut.wait(t, "a device with another CA's certificate refused at the handshake", ended("tls: unknown certificate authority"))

	// A token for another node than the certificate's: 4403.
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	victim := wire.NewNodeID()
	tok, err := signer.Mint(auth.MintOptions{Subject: victim, Tenant: DefaultTenant,
		Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	thief := newLogSink()
	runRoot(t, thief, thief, "agent", "--connect", deviceURL, "--token", tok,
		"--ca", caFile, "--client-cert", devCert, "--client-key", devKey)
	thief.wait(t, "a token for another node than the certificate's refused with 4403", func(m map[string]any) bool {
		err, _ := m["err"].(string)
		return m["msg"] == "agent stopped" && strings.Contains(err, "closed the session with 4403")
	})
	stderr.wait(t, "the tier says whom it refused", line("refused a device token for another node than its certificate's",
		"node_id", victim, "cert_node_id", node))
	if got := toolsOf(t, s, ".echo.invoke"); len(got) != 1 || got[0] != echoes[0] {
		t.Errorf("echo tools after the refusal %v, want %v alone", got, echoes)
	}
}

// TestDeviceMTLSStartErrors: --client-ca without TLS, a bad bundle, own
// devices under --client-ca, a half client pair, a certificate naming no
// node, and one certificate for many mock devices are errors at start
// naming the flag.
func TestDeviceMTLSStartErrors(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1) // a server's: names no node
	caFile := ca.WriteCA(t, dir)
	devCert, devKey := ca.WriteDevice(t, dir, wire.NewNodeID())
	const url = "wss://127.0.0.1:1/v1/device/ws"
	tlsArgs := []string{"--tls-cert", certFile, "--tls-key", keyFile}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"device client-ca without tls", []string{"device", "--client-ca", caFile}, "--client-ca needs --tls-cert"},
		{"device client-ca not PEM", append([]string{"device", "--client-ca", keyFile + ".missing"}, tlsArgs...), "--client-ca"},
		{"device client-ca with mock", append([]string{"device", "--client-ca", caFile, "--mock", "1"}, tlsArgs...), "--mock 0"},
		{"all-in-one client-ca with own devices", append([]string{"all-in-one", "--client-ca", caFile}, tlsArgs...), "--local-agent=false"},
		{"agent cert without key", []string{"agent", "--connect", url, "--client-cert", devCert}, "--client-cert needs --client-key"},
		{"mock-fleet key without cert", []string{"mock-fleet", "--connect", url, "--client-key", devKey}, "--client-key needs --client-cert"},
		{"agent cert of no node", []string{"agent", "--connect", url, "--client-cert", certFile, "--client-key", keyFile}, "names no node"},
		{"mock-fleet many nodes", []string{"mock-fleet", "--connect", url, "-n", "2", "--client-cert", devCert, "--client-key", devKey}, "-n must be 1"},
	} {
		t.Run(c.name, func(t *testing.T) { startFails(t, c.args, c.want) })
	}
}
