package device_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// pinWrite is the projected name of node's simulated pin's write verb.
func pinWrite(node string) string {
	return bus.ToolName{KindShort: "gpio", NodeID: node, CapID: "pin", Verb: "write"}.String()
}

// recordingPin returns mock device options for node whose pin.write
// handler counts its runs in ran.
func recordingPin(node string, set *schemas.Set, ran *atomic.Int32) agent.Options {
	o := agent.MockOptions(node, set, 1)
	o.Handlers["pin.write"] = func(context.Context, json.RawMessage) (any, error) {
		ran.Add(1)
		return map[string]any{"node_id": node, "pin": "pin", "level": 1, "ts_ms": time.Now().UnixMilli()}, nil
	}
	return o
}

// callWithDeadline is tt.call with the gateway's absolute deadline too.
func (tt *testTier) callWithDeadline(ctx context.Context, node, tool, args string, budget time.Duration, deadline time.Time) callResult {
	b, _ := json.Marshal(bus.Call{Tool: tool, Arguments: json.RawMessage(args)})
	m := nats.NewMsg(bus.NodeCmd(node))
	m.Data = b
	m.Header.Set(bus.HeaderTenant, tenant)
	m.Header.Set(bus.HeaderBudgetMs, strconv.Itoa(int(budget/time.Millisecond)))
	m.Header.Set(bus.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	m.Header.Set(bus.HeaderRequestID, wire.NewMsgID())
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	start := time.Now()
	resp, err := tt.nc.RequestMsgWithContext(ctx, m)
	r := callResult{err: err, elapsed: time.Since(start)}
	if err == nil {
		if err := json.Unmarshal(resp.Data, &r.reply); err != nil {
			r.err = errors.New("reply does not decode: " + string(resp.Data))
		}
	}
	return r
}

// TestCallPastItsDeadline: a call whose Okso-Deadline has passed (it was
// held somewhere while its caller gave up) is answered
// E_DEADLINE_EXCEEDED and audited, and never reaches the device, however
// much budget it still claims. The same call within its deadline does.
func TestCallPastItsDeadline(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	var ran atomic.Int32
	d := tt.runDevice(t, recordingPin(wire.NewNodeID(), tt.set, &ran))
	name := pinWrite(d.node)

	r := tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(-10*time.Second))
	wantCode(t, r, bus.CodeDeadlineExceeded)
	tt.audit.wait(t, func(e auditEntry) bool {
		return e.Decision == bus.DecisionTimeout && e.Code == bus.CodeDeadlineExceeded && e.Tool == name
	})
	// The same call in time runs: the handler was there to run.
	wantOK(t, tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(5*time.Second)))
	if n := ran.Load(); n != 1 {
		t.Fatalf("pin.write ran %d times, want once: the call past its deadline must not run", n)
	}
}

// TestCallBoundByItsDeadline: a call runs until the earlier of its budget
// and its deadline, here the deadline, far shorter than the capability's
// 60 s and the budget's.
func TestCallBoundByItsDeadline(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	node := wire.NewNodeID()
	o := agent.Options{NodeID: node, Capabilities: []bus.Capability{echoCap("slow", bus.Constraints{DeadlineMsDefault: 60000})},
		Handlers: map[string]agent.Handler{"slow.invoke": func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done() // the tier's cancel, or the device's own deadline
			return nil, ctx.Err()
		}}}
	tt.runDevice(t, o)
	r := tt.callWithDeadline(t.Context(), node, tool(node, "slow"), `{"message":"hi"}`, time.Minute,
		time.Now().Add(300*time.Millisecond))
	wantCode(t, r, bus.CodeDeadlineExceeded)
	if r.elapsed < 300*time.Millisecond {
		t.Errorf("call ended after %v, before its deadline", r.elapsed)
	}
}

// TestCmdDeadlineAt: a device that announces the feature deadline_at
// gets cmds with deadline_at_ms on the clock of its auth_ok; one that
// does not gets cmds an older device's strict decoder still reads.
func TestCmdDeadlineAt(t *testing.T) {
	tt := newTestTier(t, device.TierOptions{})
	t.Run("announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc := tt.dial(t, nil)
		rc.recv(t, wire.TypeHello, nil)
		authAt := time.Now() // before the tier can read its clock for auth_ok
		rc.send(t, wire.TypeAuth, "", wire.Auth{Token: tt.token(t, node)})
		var ok wire.AuthOK
		rc.recv(t, wire.TypeAuthOK, &ok)
		if d := time.Duration(authAt.UnixMilli()-ok.ServerTimeMs) * time.Millisecond; d < -time.Second || d > time.Second {
			t.Fatalf("auth_ok server_time_ms %d, %v from this host's clock", ok.ServerTimeMs, d)
		}
		m := manifest(node, echoCap("slow", bus.Constraints{DeadlineMsDefault: 1500}))
		m["features"] = []string{wire.FeatureDeadlineAt, "not_yet_invented"}
		rc.send(t, wire.TypeAnnounce, "", m)
		rc.recv(t, wire.TypeAnnounceOK, nil)
		res := tt.goCall(t.Context(), node, tenant, tool(node, "slow"), `{"message":"hi"}`)
		var cmd wire.Cmd
		rc.recv(t, wire.TypeCmd, &cmd)
		elapsed := time.Since(authAt).Milliseconds()
		if got := cmd.DeadlineAtMs - ok.ServerTimeMs; got < 1500 || got > 1500+elapsed+1 {
			t.Errorf("deadline_at_ms is server_time_ms + %d, want the 1500 ms deadline after at most %d ms", got, elapsed)
		}
		rc.recv(t, wire.TypeCancel, nil)
		wantCode(t, <-res, bus.CodeDeadlineExceeded)
	})
	t.Run("not announced", func(t *testing.T) {
		node := wire.NewNodeID()
		rc, _ := tt.connectRaw(t, node)
		res := tt.goCall(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`)
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
		wantOK(t, <-res)
	})
}
