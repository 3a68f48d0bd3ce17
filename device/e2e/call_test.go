package e2e_test

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
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestCall drives calls through the tier to an agent.Device.
func TestCall(t *testing.T) {
	t.Run("ok", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		tt.echo(t, d.node)
		tt.audit.wait(t, func(e auditEntry) bool {
			return e.Decision == bus.DecisionAllowed && e.Tool == echoTool(d.node)
		})
	})

	t.Run("unknown tool", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		wantCode(t, tt.call(t.Context(), d.node, tenant, tool(d.node, "nope"), `{"message":"hi"}`), schemas.CodeToolNotFound)
		wantCode(t, tt.call(t.Context(), d.node, tenant, tool(wire.NewNodeID(), "echo"), `{"message":"hi"}`), schemas.CodeToolNotFound)
		tt.echo(t, d.node)
	})

	t.Run("other tenant", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		wantCode(t, tt.call(t.Context(), d.node, "umbrella", echoTool(d.node), `{"message":"hi"}`), schemas.CodeSafetyDenied)
		wantCode(t, tt.call(t.Context(), d.node, "", echoTool(d.node), `{"message":"hi"}`), schemas.CodeSafetyDenied)
		tt.audit.wait(t, func(e auditEntry) bool {
			return e.Decision == bus.DecisionDenied && e.Code == schemas.CodeSafetyDenied
		})
		tt.echo(t, d.node)
	})

	t.Run("device never answers", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		o := agent.MockOptions(node, tt.set, 1)
		o.Capabilities = append(o.Capabilities, echoCap("slow", schemas.Constraints{DeadlineMsDefault: 100}))
		o.Handlers["slow.invoke"] = func(context.Context, json.RawMessage) (any, error) {
			<-t.Context().Done() // until the test ends, whatever the deadline says
			return agent.EchoResult{}, nil
		}
		tt.runDevice(t, o)

		r := tt.call(t.Context(), node, tenant, tool(node, "slow"), `{"message":"hi"}`)
		wantCode(t, r, schemas.CodeDeadlineExceeded)
		if r.elapsed < 100*time.Millisecond || r.elapsed > waitFor/2 {
			t.Errorf("E_DEADLINE_EXCEEDED after %v, want it at the 100ms deadline", r.elapsed)
		}
		tt.audit.wait(t, func(e auditEntry) bool {
			return e.Decision == bus.DecisionTimeout && e.Tool == tool(node, "slow")
		})
		tt.echo(t, node) // the other capability is unaffected
	})

	t.Run("late cmd_ack is dropped", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		release := make(chan struct{})
		o := agent.MockOptions(node, tt.set, 1)
		o.Capabilities = []schemas.Capability{echoCap("slow", schemas.Constraints{DeadlineMsDefault: 100})}
		o.Handlers = map[string]agent.Handler{"slow.invoke": func(context.Context, json.RawMessage) (any, error) {
			wait(t, release) // past the deadline
			return agent.EchoResult{Message: "late", NodeID: node}, nil
		}}
		tt.runDevice(t, o)

		wantCode(t, tt.call(t.Context(), node, tenant, tool(node, "slow"), `{"message":"hi"}`), schemas.CodeDeadlineExceeded)
		close(release)
		tt.audit.wait(t, func(e auditEntry) bool {
			return e.Decision == bus.DecisionLateAck && e.NodeID == node
		})
		// The expired call no longer counts: the capability still answers.
		wantOK(t, tt.call(t.Context(), node, tenant, tool(node, "slow"), `{"message":"hi"}`))
	})

	t.Run("rate_limit_rps", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		o := agent.MockOptions(node, tt.set, 1)
		// One call per 100 s: the second call of the test is always over.
		o.Capabilities = []schemas.Capability{echoCap("echo", schemas.Constraints{RateLimitRPS: 0.01})}
		tt.runDevice(t, o)
		tt.echo(t, node)
		wantCode(t, tt.call(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`), schemas.CodeRateLimited)
		tt.audit.wait(t, func(e auditEntry) bool {
			return e.Decision == bus.DecisionRateLimit && e.NodeID == node
		})
	})

	t.Run("max_concurrency", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		started, release := make(chan struct{}, 1), make(chan struct{})
		o := agent.MockOptions(node, tt.set, 1)
		o.Capabilities = []schemas.Capability{echoCap("echo", schemas.Constraints{MaxConcurrency: 1})}
		echo := agent.Echo(node)
		o.Handlers = map[string]agent.Handler{"echo.invoke": func(ctx context.Context, args json.RawMessage) (any, error) {
			started <- struct{}{}
			wait(t, release)
			return echo(ctx, args)
		}}
		tt.runDevice(t, o)

		first := tt.goCall(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`)
		select {
		case <-started:
		case r := <-first:
			t.Fatalf("first call ended before its handler ran: %v", r)
		}
		wantCode(t, tt.call(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`), schemas.CodeRateLimited)
		close(release)
		wantOK(t, <-first)
		tt.echo(t, node)
	})

	t.Run("device disconnects during the call", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		started, release := make(chan struct{}, 1), make(chan struct{})
		o := agent.MockOptions(node, tt.set, 1)
		o.Handlers = map[string]agent.Handler{"echo.invoke": func(context.Context, json.RawMessage) (any, error) {
			started <- struct{}{}
			wait(t, release) // never answers before the device is gone
			return agent.EchoResult{}, nil
		}}
		d := tt.runDevice(t, o)

		res := tt.goCall(t.Context(), node, tenant, echoTool(node), `{"message":"hi"}`)
		<-started
		d.cancel() // Run waits for the handler; do not wait for Run yet
		r := <-res
		wantCode(t, r, schemas.CodeNodeOffline)
		close(release)
		if err := d.stop(); err != nil {
			t.Fatalf("device: %v", err)
		}
	})
}

// pinWrite is the projected name of node's simulated pin's write verb.
func pinWrite(node string) string {
	return schemas.ToolName{KindShort: "gpio", NodeID: node, CapID: "pin", Verb: "write"}.String()
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
	tt := newTestTier(t, tier.Options{})
	var ran atomic.Int32
	d := tt.runDevice(t, recordingPin(wire.NewNodeID(), tt.set, &ran))
	name := pinWrite(d.node)

	r := tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(-10*time.Second))
	wantCode(t, r, schemas.CodeDeadlineExceeded)
	tt.audit.wait(t, func(e auditEntry) bool {
		return e.Decision == bus.DecisionTimeout && e.Code == schemas.CodeDeadlineExceeded && e.Tool == name
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
	tt := newTestTier(t, tier.Options{})
	node := wire.NewNodeID()
	o := agent.Options{NodeID: node, Capabilities: []schemas.Capability{echoCap("slow", schemas.Constraints{DeadlineMsDefault: 60000})},
		Handlers: map[string]agent.Handler{"slow.invoke": func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done() // the tier's cancel, or the device's own deadline
			return nil, ctx.Err()
		}}}
	tt.runDevice(t, o)
	r := tt.callWithDeadline(t.Context(), node, tool(node, "slow"), `{"message":"hi"}`, time.Minute,
		time.Now().Add(300*time.Millisecond))
	wantCode(t, r, schemas.CodeDeadlineExceeded)
	if r.elapsed < 300*time.Millisecond {
		t.Errorf("call ended after %v, before its deadline", r.elapsed)
	}
}
