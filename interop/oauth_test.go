package interop

import (
	"bufio"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOAuthSignIn: the official TypeScript SDK signs in to okso's own
// authorization server with its authProvider, headless, as Claude Code
// or any MCP host would: discovery, registration (RFC 7591, or a Client
// ID Metadata Document), the authorize page, okso oauth approve, the
// code redeemed and the refresh made at a second gateway replica behind
// the same public URL, a tool call, then a reused refresh token revoking
// its family. A refresh token is no bearer token.
func TestOAuthSignIn(t *testing.T) {
	for _, mode := range []string{"registration", "metadata document"} {
		t.Run(mode, func(t *testing.T) {
			env := []string{}
			if mode == "metadata document" {
				env = append(env, "OKSO_CIMD_URL="+serveClientDocument(t))
			}
			// Replica A's address is the public URL of both.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			base := "http://" + addr
			o := startOkso(t, 1, "--mcp-addr", addr, "--public-url", base, "--oauth-cimd-allow-loopback")
			replicaB := startGateway(t, o, "--public-url", base, "--oauth-server", "--oauth-cimd-allow-loopback")

			const redirect = "http://127.0.0.1:4567/callback"
			p := startScript(t, append(env, "OKSO_URL="+base+"/mcp", "OKSO_TOKEN_ORIGIN="+replicaB, "OKSO_REDIRECT="+redirect,
				"OKSO_TOOL="+listedName(echoTool(o.nodes[0]))), "oauth.mjs")
			var step struct {
				Authorize struct {
					ClientID string `json:"client_id"`
					Resource string `json:"resource"`
					Method   string `json:"code_challenge_method"`
				} `json:"authorize"`
			}
			p.next(time.Minute, &step)
			if step.Authorize.Resource != base+"/mcp" || step.Authorize.Method != "S256" {
				t.Fatalf("the SDK's authorization request: %+v", step.Authorize)
			}
			if mode == "metadata document" && !strings.HasPrefix(step.Authorize.ClientID, "https://127.0.0.1:") {
				t.Fatalf("client id %q: want the metadata document's URL", step.Authorize.ClientID)
			}
			var page struct {
				UserCode   string `json:"user_code"`
				CSP        string `json:"csp"`
				AsksSecret bool   `json:"asks_secret"`
			}
			p.next(time.Minute, &page)
			if !strings.Contains(page.CSP, "frame-ancestors 'none'") || page.AsksSecret {
				t.Errorf("authorize page: CSP %q, asks for a secret: %v", page.CSP, page.AsksSecret)
			}
			out, err := exec.Command(binary, "oauth", "approve", page.UserCode, "--tenant", tenant, "--scope", "tools:call:read_only",
				"--nats-url", o.natsURL, "--data-dir", o.dataDir).CombinedOutput()
			if err != nil {
				t.Fatalf("okso oauth approve: %v\n%s", err, out)
			}
			if _, err := p.stdin.Write([]byte("approved\n")); err != nil {
				t.Fatal(err)
			}
			var redirected struct {
				Redirect struct {
					Iss     string `json:"iss"`
					HasCode bool   `json:"has_code"`
				} `json:"redirect"`
			}
			p.next(time.Minute, &redirected)
			if redirected.Redirect.Iss != base || !redirected.Redirect.HasCode {
				t.Fatalf("authorization response: %+v", redirected.Redirect)
			}
			var call struct {
				Call struct {
					Tool    string `json:"tool"`
					IsError bool   `json:"isError"`
				} `json:"call"`
			}
			p.next(time.Minute, &call)
			if call.Call.IsError || call.Call.Tool != listedName(echoTool(o.nodes[0])) {
				t.Fatalf("tool call with the OAuth token: %+v", call.Call)
			}
			var refresh struct {
				Refresh struct {
					Result    string `json:"result"`
					Rotated   bool   `json:"rotated"`
					NewAccess bool   `json:"new_access"`
				} `json:"refresh"`
			}
			p.next(time.Minute, &refresh)
			if refresh.Refresh.Result != "AUTHORIZED" || !refresh.Refresh.Rotated || !refresh.Refresh.NewAccess {
				t.Fatalf("refresh: %+v", refresh.Refresh)
			}
			var done struct {
				Done struct {
					TokenRequests   []string `json:"token_requests"`
					RefreshAsBearer int      `json:"refresh_as_bearer"`
					Reuse           struct {
						Status int    `json:"status"`
						Error  string `json:"error"`
					} `json:"reuse"`
					Newest struct {
						Status int    `json:"status"`
						Error  string `json:"error"`
					} `json:"newest_after_reuse"`
				} `json:"done"`
			}
			p.next(time.Minute, &done)
			d := done.Done
			if strings.Join(d.TokenRequests, ",") != "authorization_code,refresh_token" {
				t.Errorf("token requests at replica B: %v", d.TokenRequests)
			}
			if d.RefreshAsBearer != http.StatusUnauthorized {
				t.Errorf("a refresh token as a bearer token: %d, want 401", d.RefreshAsBearer)
			}
			if d.Reuse.Status != http.StatusBadRequest || d.Reuse.Error != "invalid_grant" ||
				d.Newest.Status != http.StatusBadRequest || d.Newest.Error != "invalid_grant" {
				t.Errorf("a reused refresh token: %+v, then the newest: %+v; want both invalid_grant", d.Reuse, d.Newest)
			}
			p.finish()
		})
	}
}

// serveClientDocument serves a Client ID Metadata Document over https on
// 127.0.0.1 (admitted by okso's test-only --oauth-cimd-allow-loopback),
// trusted by the okso processes the test starts after it (SSL_CERT_FILE),
// and returns its URL, the client id.
func serveClientDocument(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewTLSServer(mux)
	t.Cleanup(srv.Close)
	id := srv.URL + "/okso-interop/client.json"
	mux.HandleFunc("/okso-interop/client.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"client_id": id, "client_name": "okso interop (TS SDK, metadata document)",
			"redirect_uris": []string{"http://127.0.0.1:4567/callback"}, "token_endpoint_auth_method": "none",
			"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		})
	})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", ca)
	return id
}

// startGateway starts `okso gateway` on o's NATS and data dir (another
// replica) and returns its address (http://host:port).
func startGateway(t *testing.T, o *okso, extra ...string) string {
	t.Helper()
	args := append([]string{"gateway", "--nats-url", o.natsURL, "--data-dir", o.dataDir, "--nats-name", "gateway-b",
		"--mcp-addr", "127.0.0.1:0"}, extra...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	var log tailBuffer
	exited := make(chan struct{}) // closed once it is reaped, with werr
	var werr error
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			_, _ = log.Write(append(sc.Bytes(), '\n'))
			var m struct {
				Msg    string `json:"msg"`
				MCPURL string `json:"mcp_url"`
			}
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Msg == "listening" && m.MCPURL != "" {
				select {
				case urls <- m.MCPURL:
				default:
				}
			}
		}
		werr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			if werr != nil {
				t.Errorf("okso gateway exited with %v on SIGTERM; its log ends:\n%s", werr, log.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("okso gateway did not stop within 20 s of SIGTERM")
		}
	})
	select {
	case u := <-urls:
		return strings.TrimSuffix(u, "/mcp")
	case <-exited:
		t.Fatalf("okso gateway exited: %v\n%s", werr, log.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("okso gateway did not start within 60 s:\n%s", log.String())
	}
	return ""
}
