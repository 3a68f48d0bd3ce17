package roles

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// tlsSession connects an MCP client to url with token, trusting roots.
func tlsSession(t *testing.T, url, token string, roots *x509.CertPool) (*sdk.ClientSession, error) {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	t.Cleanup(tr.CloseIdleConnections)
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{
		Endpoint: url, HTTPClient: &http.Client{Transport: bearer.Transport{Token: token, Base: tr}}, MaxRetries: -1,
	}, nil)
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// servedSerial is the serial of the certificate served on the host:port
// of url.
func servedSerial(t *testing.T, url string, roots *x509.CertPool) int64 {
	t.Helper()
	host := strings.SplitN(strings.SplitN(url, "://", 2)[1], "/", 2)[0]
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", host, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake with %s: %v", host, err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

// TestTLS runs all-in-one with --tls-cert and --tls-key: its banner says
// https:// and wss://, its own simulated device connects, a mock fleet
// dials wss:// with --ca and its tools are listed and called by the Go
// SDK client over HTTPS, while a client or a fleet without the CA is
// refused at the handshake; a certificate written over the files is
// served by the next connections of both listeners without a restart.
func TestTLS(t *testing.T) {
	dir, dataDir := t.TempDir(), t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	caFile := ca.WriteCA(t, dir)
	stdout, stderr := newLogSink(), newLogSink()
	runRoot(t, stdout, stderr, "all-in-one", "--data-dir", dataDir, "--mcp-addr", "127.0.0.1:0",
		"--device-addr", "127.0.0.1:0", "--mock", "1", "--local-agent=false", "--tls-cert", certFile, "--tls-key", keyFile)
	bannerRow(t, stdout, "logs")
	mcpURL, deviceURL := bannerRow(t, stdout, "MCP endpoint"), bannerRow(t, stdout, "device tier")
	if !strings.HasPrefix(mcpURL, "https://127.0.0.1:") || !strings.HasPrefix(deviceURL, "wss://127.0.0.1:") {
		t.Fatalf("banner endpoints %s and %s, want https:// and wss://", mcpURL, deviceURL)
	}
	token := bannerRow(t, stdout, "agent token")
	stderr.wait(t, "all-in-one's own device over wss://", line("mock devices connected"))

	fleetOut := newLogSink()
	runRoot(t, fleetOut, fleetOut, "mock-fleet", "-n", "1", "--tenant", "other", "--data-dir", dataDir,
		"--connect", deviceURL, "--ca", caFile)
	fleetOut.wait(t, "the fleet over wss:// with --ca", line("mock devices connected"))
	noCA := newLogSink() // another seed: not the first fleet's node id, on its data dir
	runRoot(t, noCA, noCA, "mock-fleet", "-n", "1", "--tenant", "other", "--data-dir", dataDir, "--seed", "2",
		"--connect", deviceURL, "--log-level", "debug")
	noCA.wait(t, "the fleet without --ca refused at the handshake", func(m map[string]any) bool {
		err, _ := m["err"].(string)
		return m["msg"] == "device session ended" && strings.Contains(err, "certificate signed by unknown authority")
	})

	if _, err := tlsSession(t, mcpURL, token, x509.NewCertPool()); err == nil ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client without the CA: %v, want the handshake refused", err)
	}
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := signer.Mint(auth.MintOptions{Subject: "agent", Tenant: "other", Scopes: []string{auth.ScopeReadOnly}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, err := tlsSession(t, mcpURL, other, ca.Pool())
	if err != nil {
		t.Fatalf("a client with the CA: %v", err)
	}
	echoes := toolsOf(t, s, ".echo.invoke")
	if len(echoes) != 1 {
		t.Fatalf("tenant other lists echo tools %v, want the fleet's one", echoes)
	}
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoes[0], Arguments: map[string]any{"message": "over tls"}})
	if err != nil || res.IsError {
		t.Fatalf("echo over https and wss: %v %+v", err, res)
	}

	// Rotation: the next handshakes of both listeners see serial 2.
	ca.WriteLeaf(t, dir, 2)
	for _, url := range []string{mcpURL, deviceURL} {
		eventually(t, url+" serves the rotated certificate", func() bool { return servedSerial(t, url, ca.Pool()) == 2 })
	}
	if res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echoes[0], Arguments: map[string]any{"message": "rotated"}}); err != nil || res.IsError {
		t.Fatalf("echo after the rotation: %v %+v", err, res)
	}
}

// TestTLSStartErrors: a half pair, a missing file or a bad PEM is an
// error at start naming the flag or the file.
func TestTLSStartErrors(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"gateway cert without key", []string{"gateway", "--tls-cert", certFile}, "--tls-cert needs --tls-key"},
		{"device key without cert", []string{"device", "--tls-key", keyFile}, "--tls-key needs --tls-cert"},
		{"gateway missing cert", []string{"gateway", "--tls-cert", missing, "--tls-key", keyFile}, missing},
		{"device bad cert", []string{"device", "--tls-cert", bad, "--tls-key", keyFile}, bad},
		{"all-in-one bad key", []string{"all-in-one", "--tls-cert", certFile, "--tls-key", bad}, bad},
		{"agent bad ca", []string{"agent", "--connect", "wss://127.0.0.1:1/v1/device/ws", "--ca", bad}, bad},
		{"mock-fleet missing ca", []string{"mock-fleet", "--connect", "wss://127.0.0.1:1/v1/device/ws", "--ca", missing}, missing},
	} {
		t.Run(c.name, func(t *testing.T) { startFails(t, c.args, c.want) })
	}
}

// TestPlainWarning: a listener on an address other hosts can reach,
// without TLS, says so once at start; on loopback, or with TLS, it does
// not.
func TestPlainWarning(t *testing.T) {
	const warning = "listening without TLS on an address other hosts can reach"
	warned := func(m map[string]any) bool { msg, _ := m["msg"].(string); return strings.HasPrefix(msg, warning) }
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	for _, c := range []struct {
		name  string
		args  []string
		warns int
	}{
		{"plain on every address", []string{"--mcp-addr", "0.0.0.0:0", "--device-addr", "0.0.0.0:0"}, 2},
		{"plain on loopback", []string{"--mcp-addr", "127.0.0.1:0", "--device-addr", "127.0.0.1:0"}, 0},
		{"tls on every address", []string{"--mcp-addr", "0.0.0.0:0", "--device-addr", "0.0.0.0:0",
			"--tls-cert", certFile, "--tls-key", keyFile}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			stdout, stderr := newLogSink(), newLogSink()
			stop := runRoot(t, stdout, stderr, append([]string{"all-in-one", "--data-dir", t.TempDir(), "--mock", "0",
				"--local-agent=false"}, c.args...)...)
			bannerRow(t, stdout, "logs") // both listeners are bound, and said so
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := stderr.count(warned); n != c.warns {
				t.Errorf("%d warnings, want %d:\n%s", n, c.warns, stderr)
			}
			if c.warns > 0 && !strings.Contains(stderr.String(), "plain text") {
				t.Errorf("the warning does not say what is exposed:\n%s", stderr)
			}
		})
	}
}

// startFails runs okso args in-process, with a data dir of its own and
// ephemeral listeners, and checks that it fails saying want.
func startFails(t *testing.T, args []string, want string) {
	t.Helper()
	args = append(args, "--data-dir", t.TempDir())
	if args[0] == "gateway" || args[0] == "all-in-one" {
		args = append(args, "--mcp-addr", "127.0.0.1:0")
	}
	if args[0] == "device" || args[0] == "all-in-one" {
		args = append(args, "--device-addr", "127.0.0.1:0")
	}
	out := newLogSink()
	root := NewRoot(out, out)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("okso %s: %v, want an error naming %s", strings.Join(args, " "), err, want)
	}
}
