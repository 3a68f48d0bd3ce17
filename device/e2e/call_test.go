package e2e_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// TestCall drives calls through the tier to an agent.Device.
func TestCall(t *testing.T) {
	t.Run("ok", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		tt.Echo(t, d.node)
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionAllowed && e.Tool == tiertest.EchoTool(d.node)
		})
	})

	t.Run("unknown tool", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		tiertest.WantCode(t, tt.Call(t.Context(), d.node, tiertest.Tenant, tiertest.Tool(d.node, "nope"), `{"message":"hi"}`), schemas.CodeToolNotFound)
		tiertest.WantCode(t, tt.Call(t.Context(), d.node, tiertest.Tenant, tiertest.Tool(wire.NewNodeID(), "echo"), `{"message":"hi"}`), schemas.CodeToolNotFound)
		tt.Echo(t, d.node)
	})

	t.Run("other tenant", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		d := tt.runMock(t)
		tiertest.WantCode(t, tt.Call(t.Context(), d.node, "umbrella", tiertest.EchoTool(d.node), `{"message":"hi"}`), schemas.CodeSafetyDenied)
		tiertest.WantCode(t, tt.Call(t.Context(), d.node, "", tiertest.EchoTool(d.node), `{"message":"hi"}`), schemas.CodeSafetyDenied)
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionDenied && e.Code == schemas.CodeSafetyDenied
		})
		tt.Echo(t, d.node)
	})

	t.Run("device never answers", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		o := agent.MockOptions(node, tt.Schemas, 1)
		o.Capabilities = append(o.Capabilities, tiertest.EchoCap("slow", schemas.Constraints{DeadlineMsDefault: 100}))
		o.Handlers["slow.invoke"] = func(context.Context, json.RawMessage) (any, error) {
			<-t.Context().Done() // until the test ends, whatever the deadline says
			return agent.EchoResult{}, nil
		}
		tt.runDevice(t, o)

		r := tt.Call(t.Context(), node, tiertest.Tenant, tiertest.Tool(node, "slow"), `{"message":"hi"}`)
		tiertest.WantCode(t, r, schemas.CodeDeadlineExceeded)
		if r.Elapsed < 100*time.Millisecond || r.Elapsed > tiertest.WaitFor/2 {
			t.Errorf("E_DEADLINE_EXCEEDED after %v, want it at the 100ms deadline", r.Elapsed)
		}
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionTimeout && e.Tool == tiertest.Tool(node, "slow")
		})
		tt.Echo(t, node) // the other capability is unaffected
	})

	t.Run("late cmd_ack is dropped", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		release := make(chan struct{})
		o := agent.MockOptions(node, tt.Schemas, 1)
		o.Capabilities = []schemas.Capability{tiertest.EchoCap("slow", schemas.Constraints{DeadlineMsDefault: 100})}
		o.Handlers = map[string]agent.Handler{"slow.invoke": func(context.Context, json.RawMessage) (any, error) {
			wait(t, release) // past the deadline
			return agent.EchoResult{Message: "late", NodeID: node}, nil
		}}
		tt.runDevice(t, o)

		tiertest.WantCode(t, tt.Call(t.Context(), node, tiertest.Tenant, tiertest.Tool(node, "slow"), `{"message":"hi"}`), schemas.CodeDeadlineExceeded)
		close(release)
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionLateAck && e.NodeID == node
		})
		// The expired call no longer counts: the capability still answers.
		tiertest.WantOK(t, tt.Call(t.Context(), node, tiertest.Tenant, tiertest.Tool(node, "slow"), `{"message":"hi"}`))
	})

	t.Run("rate_limit_rps", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		o := agent.MockOptions(node, tt.Schemas, 1)
		// One call per 100 s: the second call of the test is always over.
		o.Capabilities = []schemas.Capability{tiertest.EchoCap("echo", schemas.Constraints{RateLimitRPS: 0.01})}
		tt.runDevice(t, o)
		tt.Echo(t, node)
		tiertest.WantCode(t, tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`), schemas.CodeRateLimited)
		tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
			return e.Decision == bus.DecisionRateLimit && e.NodeID == node
		})
	})

	t.Run("max_concurrency", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		started, release := make(chan struct{}, 1), make(chan struct{})
		o := agent.MockOptions(node, tt.Schemas, 1)
		o.Capabilities = []schemas.Capability{tiertest.EchoCap("echo", schemas.Constraints{MaxConcurrency: 1})}
		echo := agent.Echo(node)
		o.Handlers = map[string]agent.Handler{"echo.invoke": func(ctx context.Context, args json.RawMessage) (any, error) {
			started <- struct{}{}
			wait(t, release)
			return echo(ctx, args)
		}}
		tt.runDevice(t, o)

		first := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
		select {
		case <-started:
		case r := <-first:
			t.Fatalf("first call ended before its handler ran: %v", r)
		}
		tiertest.WantCode(t, tt.Call(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`), schemas.CodeRateLimited)
		close(release)
		tiertest.WantOK(t, <-first)
		tt.Echo(t, node)
	})

	t.Run("device disconnects during the call", func(t *testing.T) {
		tt := newTestTier(t, tier.Options{})
		node := wire.NewNodeID()
		started, release := make(chan struct{}, 1), make(chan struct{})
		o := agent.MockOptions(node, tt.Schemas, 1)
		o.Handlers = map[string]agent.Handler{"echo.invoke": func(context.Context, json.RawMessage) (any, error) {
			started <- struct{}{}
			wait(t, release) // never answers before the device is gone
			return agent.EchoResult{}, nil
		}}
		d := tt.runDevice(t, o)

		res := tt.GoCall(t.Context(), node, tiertest.Tenant, tiertest.EchoTool(node), `{"message":"hi"}`)
		<-started
		d.cancel() // Run waits for the handler; do not wait for Run yet
		r := <-res
		tiertest.WantCode(t, r, schemas.CodeNodeOffline)
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

// callWithDeadline is tt.Call with a budget of its own and the gateway's
// absolute deadline too.
func (tt *testTier) callWithDeadline(ctx context.Context, node, tool, args string, budget time.Duration, deadline time.Time) tiertest.CallResult {
	m := tiertest.CallMsg(node, tiertest.Tenant, tool, args)
	m.Header.Set(bus.HeaderBudgetMs, strconv.Itoa(int(budget/time.Millisecond)))
	m.Header.Set(bus.HeaderDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	return tt.Request(ctx, m)
}

// TestCallPastItsDeadline: a call whose Okso-Deadline has passed (it was
// held somewhere while its caller gave up) is answered
// E_DEADLINE_EXCEEDED and audited, and never reaches the device, however
// much budget it still claims. The same call within its deadline does.
func TestCallPastItsDeadline(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	var ran atomic.Int32
	d := tt.runDevice(t, recordingPin(wire.NewNodeID(), tt.Schemas, &ran))
	name := pinWrite(d.node)

	r := tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(-10*time.Second))
	tiertest.WantCode(t, r, schemas.CodeDeadlineExceeded)
	tt.Audit.Wait(t, func(e tiertest.AuditEntry) bool {
		return e.Decision == bus.DecisionTimeout && e.Code == schemas.CodeDeadlineExceeded && e.Tool == name
	})
	// The same call in time runs: the handler was there to run.
	tiertest.WantOK(t, tt.callWithDeadline(t.Context(), d.node, name, `{"level":1}`, 5*time.Second, time.Now().Add(5*time.Second)))
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
	o := agent.Options{NodeID: node, Capabilities: []schemas.Capability{tiertest.EchoCap("slow", schemas.Constraints{DeadlineMsDefault: 60000})},
		Handlers: map[string]agent.Handler{"slow.invoke": func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done() // the tier's cancel, or the device's own deadline
			return nil, ctx.Err()
		}}}
	tt.runDevice(t, o)
	r := tt.callWithDeadline(t.Context(), node, tiertest.Tool(node, "slow"), `{"message":"hi"}`, time.Minute,
		time.Now().Add(300*time.Millisecond))
	tiertest.WantCode(t, r, schemas.CodeDeadlineExceeded)
	if r.Elapsed < 300*time.Millisecond {
		t.Errorf("call ended after %v, before its deadline", r.Elapsed)
	}
}
