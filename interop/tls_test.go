package interop

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTypeScriptSDKOverHTTPS: the TypeScript SDK's client lists and
// calls okso's tools over https:// when Node trusts okso's CA
// (NODE_EXTRA_CA_CERTS), its simulated device having come in over
// wss://; without the CA its connection is refused at the handshake.
func TestTypeScriptSDKOverHTTPS(t *testing.T) {
	o, caFile := startOksoTLS(t, 1)
	if !strings.HasPrefix(o.mcpURL, "https://") {
		t.Fatalf("the banner's MCP endpoint %s is not https://", o.mcpURL)
	}
	var l listed
	runScript(t, clientEnv(o.mcpURL, o.token, "NODE_EXTRA_CA_CERTS="+caFile), &l, "list.mjs")
	echo := listedName(echoTool(o.nodes[0]))
	if !slices.Contains(l.names(), echo) {
		t.Fatalf("list.mjs over https lists %v, not %s", l.names(), echo)
	}
	var res called
	runScript(t, clientEnv(o.mcpURL, o.token, "NODE_EXTRA_CA_CERTS="+caFile), &res, "call.mjs",
		`[{"name":"`+echo+`","arguments":{"message":"over tls"}}]`)
	if len(res.Outcomes) != 1 || res.Outcomes[0].Result == nil || res.Outcomes[0].Result.IsError {
		t.Fatalf("echo over https: %+v", res.Outcomes)
	}

	_, errOut, err := runNode(t, clientEnv(o.mcpURL, o.token), "list.mjs")
	if err == nil {
		t.Fatal("list.mjs without the CA succeeded")
	}
	// Node says only "fetch failed"; okso's log says why.
	deadline := time.After(10 * time.Second)
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for !strings.Contains(o.stderr.String(), "TLS handshake error") {
		select {
		case <-deadline:
			t.Fatalf("list.mjs without the CA failed, but okso logged no refused handshake:\n%s\nlog:\n%s", clip(errOut), o.stderr)
		case <-poll.C:
		}
	}
}
