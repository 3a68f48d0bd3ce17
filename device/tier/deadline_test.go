package tier_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestCmdDeadlineAt: a device that announces the feature deadline_at
// gets cmds with deadline_at_ms on the clock of its auth_ok; one that
// does not gets cmds an older device's strict decoder still reads.
func TestCmdDeadlineAt(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	t.Run("announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc := tt.dial(t, nil)
		rc.recv(t, wire.TypeHello, nil)
		authAt := time.Now() // before the tier can read its clock for auth_ok
		rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.Token(t, node)})
		var ok wire.AuthOK
		rc.recv(t, wire.TypeAuthOK, &ok)
		if d := time.Duration(authAt.UnixMilli()-ok.ServerTimeMs) * time.Millisecond; d < -time.Second || d > time.Second {
			t.Fatalf("auth_ok server_time_ms %d, %v from this host's clock", ok.ServerTimeMs, d)
		}
		m := manifest(node, tiertest.EchoCap("slow", schemas.Constraints{DeadlineMsDefault: 1500}))
		m["features"] = []string{wire.FeatureDeadlineAt, "not_yet_invented"}
		rc.send(t, wire.TypeAnnounce, "", m)
		rc.recv(t, wire.TypeAnnounceOK, nil)
		res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.Tool(node, "slow"), `{"message":"hi"}`)
		var cmd wire.Cmd
		rc.recv(t, wire.TypeCmd, &cmd)
		elapsed := time.Since(authAt).Milliseconds()
		if got := cmd.DeadlineAtMs - ok.ServerTimeMs; got < 1500 || got > 1500+elapsed+1 {
			t.Errorf("deadline_at_ms is server_time_ms + %d, want the 1500 ms deadline after at most %d ms", got, elapsed)
		}
		rc.recv(t, wire.TypeCancel, nil)
		tiertest.WantCode(t, <-res, schemas.CodeDeadlineExceeded)
	})
	t.Run("not announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc, _ := tt.connectRaw(t, node)
		res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
		e := rc.recv(t, wire.TypeCmd, nil)
		var old struct { // the cmd of okso.v1 before deadline_at_ms
			Tool       string          `json:"tool"`
			Arguments  json.RawMessage `json:"arguments"`
			DeadlineMs int             `json:"deadline_ms"`
			RequestID  string          `json:"request_id,omitempty"`
		}
		dec := json.NewDecoder(bytes.NewReader(e.Payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&old); err != nil {
			t.Fatalf("cmd %s does not decode as before: %v", e.Payload, err)
		}
		rc.send(t, wire.TypeCmdAck, e.MsgID, wire.CmdAck{OK: true,
			Result: json.RawMessage(`{"message":"hi","received_at_ms":1,"node_id":"` + node + `"}`)})
		tiertest.WantOK(t, <-res)
	})
}
