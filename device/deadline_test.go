package device_test

import (
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
	"github.com/okso-io/okso/schemas"
)

// pinWrite is the projected name of node's simulated pin's write verb.
func pinWrite(node string) string {
	return bus.ToolName{KindShort: "gpio", NodeID: node, CapID: "pin", Verb: "write"}.String()
}

// recordingPin returns mock device options for node whose pin.write
// handler counts its runs in ran.
func recordingPin(node string, set *schemas.Set, ran *atomic.Int32) device.Options {
	o := device.MockOptions(node, set, 1)
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
	m.Header.Set(bus.HeaderRequestID, device.NewMsgID())
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
	d := tt.runDevice(t, recordingPin(device.NewNodeID(), tt.set, &ran))
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
	node := device.NewNodeID()
	o := device.Options{NodeID: node, Capabilities: []bus.Capability{echoCap("slow", bus.Constraints{DeadlineMsDefault: 60000})},
		Handlers: map[string]device.Handler{"slow.invoke": func(ctx context.Context, _ json.RawMessage) (any, error) {
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
