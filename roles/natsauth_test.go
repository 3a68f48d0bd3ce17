package roles

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/certfile/certtest"
)

// oksoOut runs okso args in-process to its end and returns its stdout.
func oksoOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errs bytes.Buffer
	root := NewRoot(&out, &errs)
	root.SetArgs(args)
	err := root.ExecuteContext(t.Context())
	return out.String(), err
}

// TestNATSAuth splits okso as an operator would on two hosts: a device
// tier exposes its embedded NATS over TLS; a gateway with a data dir of
// its own (the tier's public signing key, no NATS credential) joins it
// with --nats-url. Without the gateway's credential (okso nats creds), or
// without the CA, it cannot start, and says why; with both, it serves the
// tier's device. Only the admin's credential may revoke a token, and a
// client with no credential cannot connect at all.
func TestNATSAuth(t *testing.T) {
	tierData, gwData, dir := t.TempDir(), t.TempDir(), t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	caFile := ca.WriteCA(t, dir)
	tierLog := newLogSink()
	runRoot(t, tierLog, tierLog, "device", "--data-dir", tierData, "--device-addr", "127.0.0.1:0", "--mock", "1",
		"--nats-listen", "127.0.0.1:0", "--nats-tls-cert", certFile, "--nats-tls-key", keyFile)
	natsURL, _ := tierLog.wait(t, "the tier listening", line("listening"))["nats_url"].(string)
	tierLog.wait(t, "the tier's device", line("mock devices connected"))

	pub, err := os.ReadFile(filepath.Join(tierData, auth.PubKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gwData, auth.PubKeyFile), pub, 0o600); err != nil {
		t.Fatal(err)
	}
	seed := func(role bus.Role) string {
		out, err := oksoOut(t, "nats", "creds", "--data-dir", tierData, "--role", string(role))
		if err != nil {
			t.Fatalf("okso nats creds --role %s: %v", role, err)
		}
		file := filepath.Join(dir, string(role)+".nk")
		if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	gwSeed, adminSeed := seed(bus.RoleGateway), seed(bus.RoleAdmin)

	t.Run("no credential", func(t *testing.T) {
		startFails(t, []string{"gateway", "--nats-url", natsURL, "--nats-ca", caFile}, "okso nats creds --role gateway")
	})
	t.Run("no CA", func(t *testing.T) {
		startFails(t, []string{"gateway", "--nats-url", natsURL, "--nats-nkey", gwSeed}, "certificate signed by unknown authority")
	})
	t.Run("no credential, raw client", func(t *testing.T) {
		nc, err := nats.Connect(natsURL, nats.Secure(&tls.Config{RootCAs: ca.Pool()}), nats.MaxReconnects(0))
		if err == nil {
			nc.Close()
			t.Fatal("a client with no credential connected")
		}
		if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Fatalf("%v, want an authorization violation", err)
		}
	})

	mcpURL := startGateway(t, "--data-dir", gwData, "--nats-url", natsURL, "--nats-nkey", gwSeed, "--nats-ca", caFile)
	token := callEcho(t, tierData, mcpURL, "over tls")

	claims, _ := auth.UnverifiedClaims(token)
	if _, err := oksoOut(t, "token", "revoke", "--nats-url", natsURL, "--nats-ca", caFile, "--nats-nkey", gwSeed, claims.ID); err == nil ||
		!strings.Contains(err.Error(), "only the admin's NATS credential may revoke") {
		t.Errorf("revoke with the gateway's credential: %v, want a refusal naming the admin's credential", err)
	}
	if out, err := oksoOut(t, "token", "revoke", "--nats-url", natsURL, "--nats-ca", caFile, "--nats-nkey", adminSeed, claims.ID); err != nil ||
		!strings.HasPrefix(out, "revoked "+claims.ID) {
		t.Fatalf("revoke with the admin's credential: %q, %v", out, err)
	}
	eventually(t, "the gateway refuses the revoked token", func() bool { return listStatus(t, mcpURL, token) == 401 })
}

// TestNATSInsecure: --nats-insecure opens the embedded server to anyone,
// and says so at every start; without it, all-in-one's exposed NATS
// admits only okso's roles, and its banner says how to get a role's
// credential.
func TestNATSInsecure(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		stdout, stderr := newLogSink(), newLogSink()
		args := []string{"all-in-one", "--data-dir", t.TempDir(), "--mcp-addr", "127.0.0.1:0", "--device-addr", "127.0.0.1:0",
			"--mock", "0", "--local-agent=false", "--nats-listen", "127.0.0.1:0"}
		if insecure {
			args = append(args, "--nats-insecure")
		}
		stop := runRoot(t, stdout, stderr, args...)
		bannerRow(t, stdout, "logs")
		nc, err := nats.Connect(bannerRow(t, stdout, "NATS"), nats.MaxReconnects(0))
		if err == nil {
			nc.Close()
		}
		warned := strings.Contains(stderr.String(), "--nats-insecure: the embedded NATS server lets anyone")
		creds := strings.Contains(stdout.String(), "nats creds --data-dir")
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		switch {
		case insecure && (err != nil || !warned || creds):
			t.Errorf("--nats-insecure: connect %v, warned %v, banner names creds %v", err, warned, creds)
		case !insecure && (err == nil || warned || !creds):
			t.Errorf("secured: connect %v, warned %v, banner names creds %v", err, warned, creds)
		}
	}
}

// TestNATSSecurityStartErrors: NATS security flags that do not go
// together stop a role at start, naming them.
func TestNATSSecurityStartErrors(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t)
	certFile, keyFile := ca.WriteLeaf(t, dir, 1)
	caFile := ca.WriteCA(t, dir)
	missing := filepath.Join(dir, "missing.nk")
	const url = "nats://127.0.0.1:1"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"nkey without url", []string{"gateway", "--nats-nkey", caFile}, "--nats-nkey and --nats-creds go with --nats-url"},
		{"nkey and creds", []string{"gateway", "--nats-url", url, "--nats-nkey", caFile, "--nats-creds", caFile}, "give one of them"},
		{"insecure with url", []string{"gateway", "--nats-url", url, "--nats-insecure"}, "are the embedded server's"},
		{"tls with url", []string{"device", "--nats-url", url, "--nats-tls-cert", certFile, "--nats-tls-key", keyFile}, "are the embedded server's"},
		{"tls without listen", []string{"gateway", "--nats-tls-cert", certFile, "--nats-tls-key", keyFile}, "--nats-tls-cert needs --nats-listen"},
		{"tls without key", []string{"gateway", "--nats-listen", "127.0.0.1:0", "--nats-tls-cert", certFile}, "--nats-tls-cert needs --nats-tls-key"},
		{"tls key missing", []string{"all-in-one", "--nats-listen", "127.0.0.1:0", "--nats-tls-cert", certFile, "--nats-tls-key", missing}, missing},
		{"ca alone", []string{"device", "--nats-ca", caFile}, "--nats-ca: nothing here dials"},
		{"nkey missing", []string{"remote", "--config", caFile, "--nats-url", url, "--nats-nkey", missing}, missing},
		{"creds role unknown", []string{"nats", "creds", "--role", "root"}, `--role "root": want one of gateway, device, remote, audit, admin`},
	} {
		t.Run(c.name, func(t *testing.T) { startFails(t, c.args, c.want) })
	}
}

// TestNATSExternal: a NATS okso does not embed, configured with okso nats
// server-config: the roles may not make okso's buckets, so a gateway
// started first stops and says to run okso nats init; once the admin has,
// a gateway and a device tier, each with its role's seed alone, serve a
// device.
func TestNATSExternal(t *testing.T) {
	keys, dir := t.TempDir(), t.TempDir()
	conf, err := oksoOut(t, "nats", "server-config", "--data-dir", keys)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "nats.conf")
	text := "listen: 127.0.0.1:-1\njetstream: {store_dir: \"" + filepath.Join(dir, "js") + "\"}\n" + conf
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("okso nats server-config does not load: %v", err)
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	url := ns.ClientURL()
	seed := func(role bus.Role) string {
		out, err := oksoOut(t, "nats", "creds", "--data-dir", keys, "--role", string(role))
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, string(role)+".nk")
		if err := os.WriteFile(f, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	gwSeed, devSeed, adminSeed := seed(bus.RoleGateway), seed(bus.RoleDevice), seed(bus.RoleAdmin)

	startFails(t, []string{"gateway", "--nats-url", url, "--nats-nkey", gwSeed}, "okso nats init")
	if out, err := oksoOut(t, "nats", "init", "--nats-url", url, "--nats-nkey", adminSeed); err != nil || !strings.Contains(out, "ready") {
		t.Fatalf("okso nats init: %q, %v", out, err)
	}
	if _, err := oksoOut(t, "nats", "init", "--nats-url", url, "--nats-nkey", gwSeed); err == nil {
		t.Error("okso nats init with the gateway's credential succeeded")
	}

	tierLog := newLogSink()
	runRoot(t, tierLog, tierLog, "device", "--data-dir", keys, "--device-addr", "127.0.0.1:0", "--mock", "1",
		"--nats-url", url, "--nats-nkey", devSeed)
	tierLog.wait(t, "the tier's device", line("mock devices connected"))
	mcpURL := startGateway(t, "--data-dir", keys, "--nats-url", url, "--nats-nkey", gwSeed, "--oauth-server")
	callEcho(t, keys, mcpURL, "external")

	// okso's own authorization server on the gateway's credential alone:
	// it keeps the request in okso_oauth, the gateway's credential may
	// not approve it, the admin's may, and the code is redeemed.
	base := strings.TrimSuffix(mcpURL, "/mcp")
	const redirect = "http://127.0.0.1:7777/cb"
	resp, err := http.Post(base+"/oauth/register", "application/json", strings.NewReader(`{"redirect_uris":["`+redirect+`"]}`))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		ClientID string `json:"client_id"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	verifier, challenge := pkce("external")
	b := browser(t)
	resp, err = b.Get(base + "/oauth/authorize?" + neturl.Values{
		"response_type": {"code"}, "client_id": {reg.ClientID}, "redirect_uri": {redirect},
		"code_challenge": {challenge}, "code_challenge_method": {"S256"}, "resource": {mcpURL},
	}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	code, csrf := userCodeRe.FindSubmatch(page), csrfRe.FindSubmatch(page)
	if code == nil || csrf == nil {
		t.Fatalf("authorize page at a gateway on its own credential: %s\n%s", resp.Status, page)
	}
	approve := []string{"oauth", "approve", string(code[1]), "--tenant", DefaultTenant, "--scope", auth.ScopeReadOnly, "--nats-url", url}
	if out, err := oksoOut(t, append(approve, "--nats-nkey", gwSeed)...); err == nil {
		t.Fatalf("okso oauth approve with the gateway's credential succeeded: %s", out)
	}
	if out, err := oksoOut(t, append(approve, "--nats-nkey", adminSeed)...); err != nil {
		t.Fatalf("okso oauth approve with the admin's credential: %v %s", err, out)
	}
	resp, err = b.PostForm(base+"/oauth/authorize", neturl.Values{"request": {string(code[1])}, "csrf": {string(csrf[1])}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := neturl.Parse(resp.Header.Get("Location"))
	st, tok := tokenAt(t, base, neturl.Values{"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")},
		"redirect_uri": {redirect}, "client_id": {reg.ClientID}, "code_verifier": {verifier}, "resource": {mcpURL}})
	if st != http.StatusOK {
		t.Fatalf("redeem at a gateway on its own credential: %d %v", st, tok)
	}
	if s := mcpStatus(t, base, tok["access_token"].(string)); s != http.StatusOK {
		t.Fatalf("/mcp with the access token: %d", s)
	}
}

// startGateway runs okso gateway with args until the test ends, and
// returns its MCP endpoint once a device has reached it.
func startGateway(t *testing.T, args ...string) string {
	t.Helper()
	log := newLogSink()
	runRoot(t, log, log, append([]string{"gateway", "--mcp-addr", "127.0.0.1:0", "--log-level", "debug"}, args...)...)
	mcpURL, _ := log.wait(t, "the gateway listening", line("listening"))["mcp_url"].(string)
	log.wait(t, "a device reaches the gateway", line("node online"))
	return mcpURL
}

// callEcho calls an echo tool the gateway at mcpURL lists with message,
// with an agent token minted with the signing key in dataDir, which it
// returns.
func callEcho(t *testing.T, dataDir, mcpURL, message string) string {
	t.Helper()
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	token, err := signer.Mint(auth.MintOptions{Subject: "agent", Tenant: DefaultTenant, Scopes: []string{auth.ScopeReadOnly}})
	if err != nil {
		t.Fatal(err)
	}
	s := mcpSession(t, mcpURL, token)
	for tl, err := range s.Tools(t.Context(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tl.Name, "sysecho-") {
			continue
		}
		res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: tl.Name, Arguments: map[string]any{"message": message}})
		if err != nil || res.IsError {
			t.Fatalf("call %q: %v %+v", tl.Name, err, res)
		}
		return token
	}
	t.Fatal("the gateway lists no echo tool")
	return ""
}
