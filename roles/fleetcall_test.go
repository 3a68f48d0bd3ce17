package roles

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/internal/bearer"
	"github.com/okso-io/okso/mcp"
	"github.com/okso-io/okso/schemas"
)

// fanRun is fleet.call's answer to a run, as the tests read it.
type fanRun struct {
	Results []struct {
		NodeID          string          `json:"node_id"`
		OK              bool            `json:"ok"`
		Result          json.RawMessage `json:"result"`
		Error           *schemas.Error  `json:"error"`
		ResultTruncated *struct {
			Bytes int `json:"bytes"`
			Limit int `json:"limit"`
		} `json:"result_truncated"`
	} `json:"results"`
	Summary struct {
		Targeted int            `json:"targeted"`
		OK       int            `json:"ok"`
		Failed   map[string]int `json:"failed"`
		Omitted  int            `json:"omitted"`
	} `json:"summary"`
	PlanID string `json:"plan_id"`
	// A dry run's.
	DryRun      bool     `json:"dry_run"`
	Targeted    int      `json:"targeted"`
	Sample      []string `json:"sample"`
	SafetyClass string   `json:"safety_class"`
}

// codes are the rows' outcomes by node: "ok" or the error code.
func (r fanRun) codes() map[string]string {
	out := map[string]string{}
	for _, row := range r.Results {
		if row.OK {
			out[row.NodeID] = "ok"
		} else if row.Error != nil {
			out[row.NodeID] = row.Error.Code
		}
	}
	return out
}

// errors are the failed rows' envelopes.
func (r fanRun) errors() []schemas.Error {
	var out []schemas.Error
	for _, row := range r.Results {
		if row.Error != nil {
			out = append(out, *row.Error)
		}
	}
	return out
}

// fanOut calls fleet.call and returns its answer, or the error envelope
// of a refused call.
func fanOut(t *testing.T, s *sdk.ClientSession, args map[string]any) (fanRun, *schemas.Error) {
	t.Helper()
	res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: listedName(mcp.ToolFleetCall), Arguments: args})
	if err != nil {
		t.Fatalf("fleet.call %v: %v", args, err)
	}
	if res.IsError {
		e := envelope(t, res)
		return fanRun{}, &e
	}
	var out fanRun
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("fleet.call: %s: %v", b, err)
	}
	return out, nil
}

// countingEcho is an echo handler that counts its calls.
func countingEcho(id string, n *atomic.Int64) agent.Handler {
	echo := agent.Echo(id)
	return func(ctx context.Context, args json.RawMessage) (any, error) {
		n.Add(1)
		return echo(ctx, args)
	}
}

// TestFleetCall: fleet.call reaches every node of a selector through its
// owner and answers a row per node: the rows of an offline node, of a
// node that never answers (within the fleet budget) and of a node at its
// concurrency limit say so while the others succeed; results and rows
// are bounded; another tenant's nodes are out of reach; a dry run sends
// nothing and its plan is run from another replica; a mutating fan-out
// runs only a plan of the same verb and arguments.
func TestFleetCall(t *testing.T) {
	const mocks = 8
	f := startAllInOne(t, mocks, func(c *AllInOneConfig) { c.Gateway.FleetBudget = 3 * time.Second })
	var calls atomic.Int64 // of the counted devices' echo
	counted := make([]string, 3)
	for i := range counted {
		counted[i], _ = f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
			o.Handlers["echo.invoke"] = countingEcho(id, &calls)
			o.Labels = map[string]string{"group": "counted"}
		})
	}
	gone, stop := f.connectDevice(DefaultTenant, nil)
	stop()
	theirs, _ := f.connectDevice("other", nil)
	reader := f.client(f.token(auth.MintOptions{}), "")
	all := mocks + len(counted)

	t.Run("every online node", func(t *testing.T) {
		run, e := fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "hi"}})
		if e != nil {
			t.Fatalf("refused: %s %s", e.Code, e.Message)
		}
		if run.Summary.Targeted != all || run.Summary.OK != all || len(run.Results) != all || len(run.Summary.Failed) != 0 {
			t.Fatalf("summary %+v, %d rows; want %d ok (failures %v)", run.Summary, len(run.Results), all, run.errors())
		}
		for _, row := range run.Results {
			var r struct {
				NodeID  string `json:"node_id"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(row.Result, &r); err != nil || r.NodeID != row.NodeID || r.Message != "hi" || row.NodeID == theirs {
				t.Errorf("row %s: %s", row.NodeID, row.Result)
			}
		}
		// By kind, cap_id and verb, and a selector: the same verb.
		run, e = fanOut(t, reader, map[string]any{"kind": "system.echo", "cap_id": "echo", "verb": "invoke",
			"arguments": map[string]any{"message": "x"}, "selector": map[string]any{"labels": map[string]any{"group": "counted"}}})
		if e != nil || run.Summary.OK != len(counted) {
			t.Errorf("by kind with labels: %+v %v", run.Summary, e)
		}
	})

	t.Run("a row per node", func(t *testing.T) {
		run, e := fanOut(t, reader, map[string]any{"tool": "sysecho.*.echo.invoke", "arguments": map[string]any{"message": "hi"},
			"selector": map[string]any{"node_ids": []string{counted[0], gone, theirs, counted[1]}}})
		if e != nil {
			t.Fatalf("refused: %s %s", e.Code, e.Message)
		}
		want := map[string]string{counted[0]: "ok", counted[1]: "ok", gone: schemas.CodeNodeOffline, theirs: schemas.CodeToolNotFound}
		if got := run.codes(); !maps.Equal(got, want) || run.Summary.Failed[schemas.CodeNodeOffline] != 1 {
			t.Errorf("rows %v, want %v (summary %+v)", got, want, run.Summary)
		}
	})

	t.Run("refused before anything is sent", func(t *testing.T) {
		before := calls.Load()
		for _, c := range []struct {
			args map[string]any
			code string
		}{
			{map[string]any{"tool": "sysecho-*-echo-invoke", "kind": "system.echo"}, schemas.CodeManifestInvalid},
			{map[string]any{"kind": "system.echo", "verb": "invoke"}, schemas.CodeManifestInvalid},
			{map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"nope": 1}}, schemas.CodeManifestInvalid},
			{map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "x"}, "max_nodes": 2}, schemas.CodeManifestInvalid},
			{map[string]any{"tool": "sys-*-metrics-subscribe"}, schemas.CodeManifestInvalid},
			{map[string]any{"tool": "gpio-*-pin-write", "arguments": map[string]any{"level": 1}}, schemas.CodeSafetyDenied},
		} {
			if _, e := fanOut(t, reader, c.args); e == nil || e.Code != c.code {
				t.Errorf("%v: %+v, want %s", c.args, e, c.code)
			}
		}
		if _, e := fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "x"},
			"max_nodes": 2}); e == nil || !strings.Contains(e.Message, "matches "+strconv.Itoa(all)+" nodes") {
			t.Errorf("max_nodes: %+v, want how many matched", e)
		}
		if n := calls.Load(); n != before {
			t.Errorf("refused fan-outs called %d nodes", n-before)
		}
	})

	t.Run("bounds", func(t *testing.T) {
		long := strings.Repeat("x", 1000)
		run, e := fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": long},
			"max_result_bytes": 256})
		if e != nil || len(run.Results) != all {
			t.Fatalf("%+v %v", run.Summary, e)
		}
		for _, row := range run.Results {
			if !row.OK || row.Result != nil || row.ResultTruncated == nil || row.ResultTruncated.Limit != 256 || row.ResultTruncated.Bytes < 1000 {
				t.Errorf("row %s: %+v", row.NodeID, row)
			}
		}
		// About 1.1 KB a row, 64 KiB in all: some rows left out, counted.
		run, e = fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": long},
			"max_result_bytes": 65536, "max_total_bytes": 65536, "selector": map[string]any{"node_ids": append(slices.Clone(counted), gone)}})
		if e != nil || run.Summary.OK != len(counted) {
			t.Fatalf("%+v %v", run.Summary, e)
		}
		run, e = fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "hi"},
			"summary_only": true, "selector": map[string]any{"node_ids": append(slices.Clone(counted), gone)}})
		if e != nil || len(run.Results) != 1 || run.Results[0].NodeID != gone || run.Summary.Omitted != len(counted) {
			t.Errorf("summary_only: %+v %v", run, e)
		}
	})

	t.Run("tenants", func(t *testing.T) {
		s := f.client(f.token(auth.MintOptions{Tenant: "other"}), "")
		run, e := fanOut(t, s, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "hi"}})
		if e != nil || len(run.Results) != 1 || run.Results[0].NodeID != theirs || !run.Results[0].OK {
			t.Errorf("tenant other: %+v %v", run, e)
		}
		run, e = fanOut(t, s, map[string]any{"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "hi"},
			"selector": map[string]any{"node_ids": []string{counted[0]}}})
		if e != nil || run.codes()[counted[0]] != schemas.CodeToolNotFound {
			t.Errorf("another tenant's node: %+v %v", run, e)
		}
	})

	t.Run("dry run and plans", func(t *testing.T) {
		writer := f.client(f.token(auth.MintOptions{Scopes: []string{auth.ScopeMutating}}), "")
		pins := map[string]any{"tool": "gpio-*-pin-write", "arguments": map[string]any{"level": 1},
			"selector": map[string]any{"labels": map[string]any{"group": "counted"}}}
		if _, e := fanOut(t, writer, pins); e == nil || e.Code != schemas.CodeSafetyDenied || !strings.Contains(e.Message, "dry_run") {
			t.Fatalf("a mutating fan-out without a plan: %+v", e)
		}
		before := calls.Load()
		dry := withArgs(pins, "dry_run", true)
		plan, e := fanOut(t, writer, dry)
		if e != nil || !plan.DryRun || plan.Targeted != len(counted) || plan.SafetyClass != schemas.SafetyMutating ||
			len(plan.Sample) != len(counted) || plan.PlanID == "" {
			t.Fatalf("dry run: %+v %v", plan, e)
		}
		echoPlan, e := fanOut(t, reader, map[string]any{"tool": "sysecho-*-echo-invoke", "dry_run": true,
			"arguments": map[string]any{"message": "hi"}})
		if e != nil || echoPlan.Targeted != all || echoPlan.SafetyClass != schemas.SafetyReadOnly {
			t.Fatalf("echo dry run: %+v %v", echoPlan, e)
		}
		if n := calls.Load(); n != before {
			t.Errorf("dry runs called %d nodes", n-before)
		}
		for _, c := range []struct {
			name string
			args map[string]any
		}{
			{"other arguments", withArgs(pins, "plan_id", plan.PlanID, "arguments", map[string]any{"level": 0})},
			{"another verb", withArgs(pins, "plan_id", echoPlan.PlanID)},
			{"an unknown plan", withArgs(pins, "plan_id", "01hzx9k3m4p7q8r9s0t1v2w3xy")},
			{"another selector", withArgs(pins, "plan_id", plan.PlanID, "selector", map[string]any{"name": "x"})},
		} {
			if _, e := fanOut(t, writer, c.args); e == nil || e.Code != schemas.CodeSafetyDenied {
				t.Errorf("%s: %+v, want E_SAFETY_DENIED", c.name, e)
			}
		}
		// Another caller's plan is no plan of its.
		stranger := f.client(f.token(auth.MintOptions{Subject: "someone-else", Scopes: []string{auth.ScopeMutating}}), "")
		if _, e := fanOut(t, stranger, withArgs(pins, "plan_id", plan.PlanID)); e == nil || e.Code != schemas.CodeSafetyDenied {
			t.Errorf("another subject's plan: %+v", e)
		}
		// An expired plan, as JetStream may still hold it for a moment.
		plans, err := bus.OpenPlans(t.Context(), f.nc, bus.PlansOptions{BindOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		stale := bus.Plan{ID: "01hzx9k3m4p7q8r9s0t1v2w3xz", Tenant: DefaultTenant, Subject: "test-agent", Tool: "gpio.*.pin.write",
			Class: schemas.SafetyMutating, Nodes: counted, ExpiresAt: time.Now().Add(-time.Second)}
		if err := plans.Put(t.Context(), &stale); err != nil {
			t.Fatal(err)
		}
		if _, e := fanOut(t, writer, withArgs(pins, "plan_id", stale.ID)); e == nil || e.Code != schemas.CodeSafetyDenied {
			t.Errorf("an expired plan: %+v", e)
		}

		// A node that joins after the dry run is not in its plan; the
		// plan runs on another replica, the selector left out.
		late, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) { o.Labels = map[string]string{"group": "counted"} })
		replica := f.secondGateway(gatewayConfig{})
		there := f.clientAt(replica.url(), f.token(auth.MintOptions{Scopes: []string{auth.ScopeMutating}}))
		run, e := fanOut(t, there, map[string]any{"tool": "gpio.*.pin.write", "arguments": map[string]any{"level": 1}, "plan_id": plan.PlanID})
		if e != nil || run.Summary.OK != len(counted) || run.PlanID != plan.PlanID || run.codes()[late] != "" {
			t.Errorf("the plan run on another replica: %+v %v", run, e)
		}
		// One node needs no plan.
		if run, e := fanOut(t, writer, withArgs(pins, "selector", map[string]any{"node_ids": []string{late}})); e != nil || run.Summary.OK != 1 {
			t.Errorf("a mutating call of one node: %+v %v", run, e)
		}
	})
}

// TestFleetCallRows: a node that never answers is E_DEADLINE_EXCEEDED in
// its row once the fleet budget ran out, and a node at its concurrency
// limit E_RATE_LIMITED, while the others succeed; each finished node is a
// progress notification; a fan-out's audit says what it did.
func TestFleetCallRows(t *testing.T) {
	f := startAllInOne(t, 2, func(c *AllInOneConfig) {
		c.Gateway.FleetBudget = 2 * time.Second
		c.Gateway.Budget = 30 * time.Second // the fleet budget ends the stuck node's call
	})
	onBus, err := f.nc.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	stuck, _ := f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
		o.Handlers["echo.invoke"] = func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	busy, _ := f.connectDevice(DefaultTenant, func(id string, o *agent.Options) {
		o.Capabilities[0].Constraints.MaxConcurrency = 1
		echo := agent.Echo(id)
		o.Handlers["echo.invoke"] = func(ctx context.Context, args json.RawMessage) (any, error) {
			entered <- struct{}{}
			<-release
			return echo(ctx, args)
		}
	})
	progress := make(chan string, 16)
	c := sdk.NewClient(&sdk.Implementation{Name: "okso-test", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
			if req.Params.ProgressToken == "fan" && req.Params.Total == 4 {
				progress <- req.Params.Message
			}
		},
	})
	s, err := c.Connect(t.Context(), &sdk.StreamableClientTransport{Endpoint: f.a.MCPURL(), MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer.Transport{Token: f.token(auth.MintOptions{}), Base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// The busy node's one slot, taken by a single call.
	single := make(chan error, 1)
	go func() {
		_, err := s.CallTool(context.Background(), &sdk.CallToolParams{Name: listedName(echoName(busy)), Arguments: map[string]any{"message": "x"}})
		single <- err
	}()
	<-entered
	params := &sdk.CallToolParams{Name: listedName(mcp.ToolFleetCall), Arguments: map[string]any{"tool": "sysecho-*-echo-invoke",
		"arguments": map[string]any{"message": "hi"}}}
	params.SetProgressToken("fan")
	res, err := s.CallTool(t.Context(), params)
	close(release)
	if err != nil || res.IsError {
		t.Fatalf("fleet.call: %+v %v", res, err)
	}
	if err := <-single; err != nil {
		t.Fatal(err)
	}
	var run fanRun
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &run)
	codes := run.codes()
	if codes[stuck] != schemas.CodeDeadlineExceeded || codes[busy] != schemas.CodeRateLimited || run.Summary.OK != 2 {
		t.Errorf("rows %v (summary %+v): want %s for %s, %s for %s, 2 ok", codes, run.Summary,
			schemas.CodeDeadlineExceeded, stuck, schemas.CodeRateLimited, busy)
	}
	for i := range 4 {
		select {
		case <-progress:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d progress notifications, want one per node (4)", i)
		}
	}
	// The fan-out's event, and one per node naming it.
	var fan *bus.AuditEvent
	children := map[string]string{}
	for fan == nil || len(children) < 4 {
		m, err := onBus.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("audit: fan-out %+v, nodes %v: %v", fan, children, err)
		}
		var ev bus.AuditEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Actor != "gateway" {
			continue
		}
		switch {
		case ev.Tool == mcp.ToolFleetCall:
			fan = &ev
		case ev.Parent != "":
			children[ev.NodeID] = ev.Code
		}
	}
	if fan.Fanout == nil || fan.Fanout.Targeted != 4 || fan.Fanout.Sent != 4 || fan.Fanout.OK != 2 || fan.Fanout.Tool != "sysecho.*.echo.invoke" {
		t.Errorf("the fan-out's audit: %+v", fan.Fanout)
	}
	if children[stuck] != schemas.CodeDeadlineExceeded || children[busy] != schemas.CodeRateLimited {
		t.Errorf("the nodes' audit: %v", children)
	}
}

// TestFleetCallCancel: a fan-out whose caller cancels sends nothing
// further, and its audit says which nodes ran.
func TestFleetCallCancel(t *testing.T) {
	f := startAllInOne(t, 0, nil)
	onBus, err := f.nc.SubscribeSync("okso.v1.audit.>")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	entered := make(chan struct{}, 3)
	for range 3 {
		f.connectDevice(DefaultTenant, func(_ string, o *agent.Options) {
			o.Handlers["echo.invoke"] = func(ctx context.Context, _ json.RawMessage) (any, error) {
				calls.Add(1)
				entered <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			}
		})
	}
	s := f.client(f.token(auth.MintOptions{}), "")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, &sdk.CallToolParams{Name: listedName(mcp.ToolFleetCall), Arguments: map[string]any{
			"tool": "sysecho-*-echo-invoke", "arguments": map[string]any{"message": "hi"}, "concurrency": 1}})
		done <- err
	}()
	<-entered
	cancel()
	<-done
	for {
		m, err := onBus.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no audit of the cancelled fan-out: %v", err)
		}
		var ev bus.AuditEvent
		if json.Unmarshal(m.Data, &ev) != nil || ev.Tool != mcp.ToolFleetCall || ev.Fanout == nil {
			continue
		}
		if ev.Fanout.Ended != "cancelled" || ev.Fanout.Sent != 1 || ev.Fanout.Targeted != 3 {
			t.Errorf("the cancelled fan-out's audit: %+v", ev.Fanout)
		}
		break
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("a cancelled fan-out called %d nodes, want 1", n)
	}
}

// withArgs is a copy of args with the pairs set.
func withArgs(args map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(args)+len(kv)/2)
	for k, v := range args {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}
