package tier_test

import (
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
)

// TestTierMetrics: sessions and pending calls are gauges of the tier's
// state; a call is counted by its kind, a frame too large by its close
// code, and no series names a node.
func TestTierMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	tt := newTestTier(t, tier.Options{Metrics: reg})
	node := wire.NewNodeID()
	rc, _ := tt.connectRaw(t, node)
	res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
	rc.recv(t, wire.TypeCmd, nil)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP okso_tier_pending_calls Calls sent to this tier's devices and not yet answered.
# TYPE okso_tier_pending_calls gauge
okso_tier_pending_calls 1
# HELP okso_tier_sessions Devices with a live session on this tier.
# TYPE okso_tier_sessions gauge
okso_tier_sessions 1
`), "okso_tier_pending_calls", "okso_tier_sessions"); err != nil {
		t.Error(err)
	}
	// Not answered: the call expires at its deadline.
	tiertest.WantCode(t, <-res, "E_DEADLINE_EXCEEDED")

	big, _ := tt.connectRaw(t, wire.NewNodeID())
	big.sendRaw(t, websocket.MessageText, []byte(strings.Repeat(" ", wire.DefaultMaxFrameBytes+1)))
	if code, _ := big.waitClose(t); code != wire.CloseTooLarge {
		t.Fatalf("closed with %d, want %d", code, wire.CloseTooLarge)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	timeouts, tooLarge := 0.0, 0.0
	for _, f := range families {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), node) {
					t.Errorf("%s names a node: %v", f.GetName(), m.Label)
				}
			}
			switch labels := labelsOf(m); f.GetName() {
			case "okso_tier_events_total":
				if labels["kind_short"] == "sysecho" && labels["decision"] == "timeout" {
					timeouts += m.GetCounter().GetValue()
				}
			case "okso_tier_session_closes_total":
				if labels["code"] == "4413" {
					tooLarge += m.GetCounter().GetValue()
				}
			}
		}
	}
	if timeouts != 1 || tooLarge != 1 {
		t.Errorf("echo calls that timed out = %v, sessions closed with 4413 = %v; want 1 and 1", timeouts, tooLarge)
	}
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.Label {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
