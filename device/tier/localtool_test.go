package tier_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

func localCap(capID, class, description string) schemas.Capability {
	return schemas.Capability{CapID: capID, Kind: schemas.KindLocal, SchemaRef: schemas.LocalRunInput,
		Verbs: []string{"run"}, SafetyClass: class, Description: description,
		Constraints: schemas.Constraints{DeadlineMsDefault: 4000}}
}

// TestLocalTool: the tier offers local_tools, takes a local tool's
// capability with its description into the node's record, hands the
// device the call with the tool's whole deadline, and audits the run with
// the query's hash, never its text.
func TestLocalTool(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	tt.Audit.KeepRaw()
	node := wire.NewNodeID()
	rc := tt.dial(t, nil)
	if ok := rc.authenticate(t, tt.Token(t, node)); !slices.Contains(ok.Features, wire.FeatureLocalTools) {
		t.Fatalf("auth_ok features %v: no %s", ok.Features, wire.FeatureLocalTools)
	}
	rc.announce(t, node, localCap("logs", schemas.SafetyReadOnly, "The sensor service's last lines."))
	rec := tt.Record(t, node)
	if len(rec.Capabilities) != 1 || rec.Capabilities[0].Description != "The sensor service's last lines." {
		t.Fatalf("record capabilities %+v, want the local tool with its description", rec.Capabilities)
	}

	const query = "50 \"lines\"\nof sensor.secret"
	tool := "local." + node + ".logs.run"
	args, _ := json.Marshal(map[string]string{"query": query})
	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tool, string(args))
	var cmd wire.Cmd
	e := rc.recv(t, wire.TypeCmd, &cmd)
	if cmd.Tool != tool || cmd.DeadlineMs != 4000 {
		t.Errorf("cmd for %s with deadline_ms %d, want %s with the tool's 4000", cmd.Tool, cmd.DeadlineMs, tool)
	}
	out, _ := json.Marshal(map[string]any{"node_id": node, "stdout": "ok\n", "exit_code": 0, "truncated": false})
	rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true, Result: out})
	tiertest.WantOK(t, <-res)

	a := tt.Audit.Wait(t, func(a tiertest.AuditEntry) bool {
		return a.Tool == tool && a.Decision == bus.DecisionAllowed
	})
	sum := sha256.Sum256([]byte(query))
	if !strings.Contains(a.Raw, `"query_sha256":"`+hex.EncodeToString(sum[:])+`"`) {
		t.Errorf("audit event %s: no query_sha256 of the query", a.Raw)
	}
	if strings.Contains(a.Raw, "sensor.secret") {
		t.Errorf("audit event %s holds the query's text", a.Raw)
	}
}

// TestLocalToolRefused: a local tool without its description, and one
// with a description too long, close the session with 4400; a
// description on another kind too.
func TestLocalToolRefused(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	echo := echoCapability()
	echo.Description = "an echo that talks"
	for name, c := range map[string]schemas.Capability{
		"no description":         localCap("logs", schemas.SafetyReadOnly, ""),
		"description too long":   localCap("logs", schemas.SafetyReadOnly, strings.Repeat("d", 1025)),
		"a control character":    localCap("logs", schemas.SafetyReadOnly, "bell\a"),
		"description on an echo": echo,
		"cap_id not a name":      localCap("9lives", schemas.SafetyReadOnly, "x"),
		"no safety class":        localCap("logs", "", "x"),
	} {
		t.Run(name, func(t *testing.T) {
			node := wire.NewNodeID()
			rc := tt.dial(t, nil)
			rc.authenticate(t, tt.Token(t, node))
			rc.send(t, wire.TypeAnnounce, "", manifest(node, c))
			code, errs := rc.waitClose(t)
			if code != wire.CloseMalformed || len(errs) != 1 || errs[0].Code != schemas.CodeManifestInvalid {
				t.Errorf("closed with %d %+v, want %d and %s", code, errs, wire.CloseMalformed, schemas.CodeManifestInvalid)
			}
		})
	}
}
