package mcp

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// fleet.call (DESIGN.md §8, issue 30) calls one unary verb, with one
// arguments object, on many nodes of the caller's tenant: each node's
// call goes to its owner exactly as a single call would (the tier's rate
// and concurrency limits, at most once, an audit event per node), and
// the answer is a row per node. A mutating or destructive fan-out over
// more than one node runs only the plan a dry run made: a model cannot
// skip the look by setting a flag.

// Bounds of fleet.call: its input schema's defaults.
const (
	defaultMaxNodes       = 100
	defaultConcurrency    = 64
	defaultMaxResultBytes = 4 << 10
	defaultMaxTotalBytes  = 4 << 20
	// DefaultFleetBudget bounds a whole fan-out (--fleet-budget).
	DefaultFleetBudget = 30 * time.Second
	// sampleSize is the most node ids a dry run shows.
	sampleSize = 10
)

// errFleetBudget ends the context of a fan-out whose budget ran out: a
// node that had not answered then is E_DEADLINE_EXCEEDED in its row.
var errFleetBudget = errors.New("the fleet budget ran out")

// callArgs are fleet.call's arguments, once they passed their schema.
type callArgs struct {
	Tool           string          `json:"tool"`
	Kind           string          `json:"kind"`
	CapID          string          `json:"cap_id"`
	Verb           string          `json:"verb"`
	Arguments      json.RawMessage `json:"arguments"`
	Selector       json.RawMessage `json:"selector"`
	MaxNodes       int             `json:"max_nodes"`
	Concurrency    int             `json:"concurrency"`
	DryRun         bool            `json:"dry_run"`
	PlanID         string          `json:"plan_id"`
	MaxResultBytes int             `json:"max_result_bytes"`
	MaxTotalBytes  int             `json:"max_total_bytes"`
	SummaryOnly    bool            `json:"summary_only"`
}

// verbRef is the verb a fan-out calls: a device tool name around the
// node id, kind_short.*.cap_id.verb.
type verbRef struct{ short, capID, verb string }

func (r verbRef) pattern() string { return r.short + ".*." + r.capID + "." + r.verb }

// name is the verb's canonical tool name on one node.
func (r verbRef) name(nodeID string) string {
	return r.short + "." + nodeID + "." + r.capID + "." + r.verb
}

// verbOf reads the verb from the arguments: exactly one of tool, or
// kind, cap_id and verb all three (a rule the flat schema states only in
// words, DESIGN.md §8).
func verbOf(kt *schemas.KindTable, a *callArgs) (verbRef, *schemas.Error) {
	triple := a.Kind != "" || a.CapID != "" || a.Verb != ""
	switch {
	case a.Tool != "" && triple:
		return verbRef{}, schemas.NewError(schemas.CodeManifestInvalid,
			"tool: name the verb one way, tool alone or kind, cap_id and verb, not both")
	case a.Tool != "":
		// No segment holds a dash, so the safe form maps back exactly.
		parts := strings.Split(strings.ReplaceAll(a.Tool, "-", "."), ".")
		if len(parts) != 4 || parts[1] != "*" {
			return verbRef{}, schemas.NewError(schemas.CodeManifestInvalid, "tool: a pattern such as sysecho.*.echo.invoke")
		}
		return verbRef{parts[0], parts[2], parts[3]}, nil
	case a.Kind == "" || a.CapID == "" || a.Verb == "":
		return verbRef{}, schemas.NewError(schemas.CodeManifestInvalid,
			"tool: name the verb, by tool (sysecho.*.echo.invoke) or by kind, cap_id and verb all three")
	}
	k, ok := kt.Lookup(a.Kind)
	if !ok {
		return verbRef{}, schemas.NewError(schemas.CodeToolNotFound, "kind: no device of this gateway can have kind "+a.Kind)
	}
	return verbRef{k.Short, a.CapID, a.Verb}, nil
}

// verbOn is the verb on one node's record: its safety class, whether it
// streams, and whether the node has it at all.
func (r verbRef) on(kt *schemas.KindTable, n *bus.Node) (class string, stream, ok bool) {
	for _, c := range n.Capabilities {
		if c.CapID != r.capID || !slices.Contains(c.Verbs, r.verb) {
			continue
		}
		k, found := kt.Lookup(c.Kind)
		if !found || k.Short != r.short {
			return "", false, false
		}
		v, found := k.Verb(r.verb)
		if !found {
			return "", false, false
		}
		return v.SafetyOf(c.SafetyClass), v.Stream, true
	}
	return "", false, false
}

// classRank orders the safety classes, the strictest last.
func classRank(class string) int {
	switch class {
	case schemas.SafetyReadOnly:
		return 0
	case schemas.SafetyMutating:
		return 1
	}
	return 2 // destructive, or a class okso does not know: the strictest
}

// digest is the SHA-256 of a JSON document written canonically (object
// members sorted, numbers as written): two calls agree on their
// arguments when their digests do. "" for no document.
func digest(doc json.RawMessage) string {
	if len(doc) == 0 || string(doc) == "null" {
		return ""
	}
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "invalid"
	}
	b, _ := json.Marshal(v)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// target is one node a fan-out calls (or answers for), resolved from the
// selector or a plan.
type target struct {
	nodeID string
	class  string // of the verb on the node's record; "" for no record
}

// resolve finds the nodes a selector targets for the verb: those of the
// caller's tenant that match every filter and have the verb, by node id.
// A node named in node_ids is targeted whatever its presence unless the
// selector says one, and a named id with no record of the tenant, or
// whose node lacks the verb, is targeted too: its row says why it was
// not called. A streaming verb is refused.
func (f *fleet) resolve(tenant string, sel *nodesArgs, ref verbRef) ([]target, *schemas.Error) {
	if sel.Presence == "" && sel.NodeIDs != nil {
		sel.Presence = "any"
	}
	var (
		targets []target
		streams bool
	)
	found := map[string]bool{}
	for _, m := range f.devices.matching(tenant, sel) {
		found[m.n.NodeID] = true
		class, stream, ok := ref.on(f.devices.kindTable(), m.n)
		if !ok {
			continue
		}
		streams = streams || stream
		targets = append(targets, target{nodeID: m.n.NodeID, class: class})
	}
	if streams {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "tool: "+ref.pattern()+
			" streams: fleet.call calls unary verbs only; subscribe to each node's stream by its own tool")
	}
	for _, id := range sel.NodeIDs {
		n := f.devices.record(tenant, id)
		if n == nil || found[id] && !has(f.devices.kindTable(), ref, n) {
			targets = append(targets, target{nodeID: id}) // its row says why it was not called
		}
	}
	slices.SortFunc(targets, func(x, y target) int { return strings.Compare(x.nodeID, y.nodeID) })
	return targets, nil
}

// has reports whether the node of record n has the verb.
func has(kt *schemas.KindTable, ref verbRef, n *bus.Node) bool {
	_, _, ok := ref.on(kt, n)
	return ok
}

// strictest is the strictest class among targets (read_only for none).
func strictest(targets []target) string {
	class := schemas.SafetyReadOnly
	for _, t := range targets {
		if t.class != "" && classRank(t.class) > classRank(class) {
			class = t.class
		}
	}
	return class
}

// callFleet serves fleet.call.
func (f *fleet) call(ctx context.Context, c *callCtx, raw json.RawMessage) (json.RawMessage, *schemas.Error) {
	var a callArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
	}
	ref, e := verbOf(f.devices.kindTable(), &a)
	if e != nil {
		return nil, e
	}
	var sel nodesArgs
	if len(a.Selector) > 0 && string(a.Selector) != "null" {
		if err := json.Unmarshal(a.Selector, &sel); err != nil {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "selector does not decode")
		}
	}
	if len(a.Arguments) == 0 || string(a.Arguments) == "null" {
		a.Arguments = json.RawMessage("{}")
	}
	// An argument left out is 0: its default.
	a.MaxNodes = cmp.Or(a.MaxNodes, defaultMaxNodes)
	a.Concurrency = cmp.Or(a.Concurrency, defaultConcurrency)
	a.MaxResultBytes = cmp.Or(a.MaxResultBytes, defaultMaxResultBytes)
	a.MaxTotalBytes = cmp.Or(a.MaxTotalBytes, defaultMaxTotalBytes)
	tenant := c.claims.Tenant
	argsDigest, selDigest := digest(a.Arguments), digest(a.Selector)
	fan := &bus.FanoutAudit{Tool: ref.pattern(), PlanID: a.PlanID, DryRun: a.DryRun}
	c.ev.Fanout = fan

	var (
		targets []target
		class   string
	)
	if a.PlanID != "" {
		plan, e := f.plan(ctx, c, a.PlanID)
		if e != nil {
			return nil, e
		}
		switch {
		case plan.Tool != ref.pattern():
			return nil, schemas.NewError(schemas.CodeSafetyDenied, "plan_id: the plan was made for another verb ("+
				plan.Tool+"): make a dry run of this one")
		case plan.Args != argsDigest:
			return nil, schemas.NewError(schemas.CodeSafetyDenied,
				"plan_id: the plan was made for other arguments: make a dry run of these")
		case selDigest != "" && plan.Selector != selDigest:
			return nil, schemas.NewError(schemas.CodeSafetyDenied,
				"plan_id: the plan was made for another selector: leave it out, or make a dry run of this one")
		}
		for _, id := range plan.Nodes {
			targets = append(targets, target{nodeID: id, class: plan.Class})
		}
		class = plan.Class
	} else {
		var e *schemas.Error
		if targets, e = f.resolve(tenant, &sel, ref); e != nil {
			return nil, e
		}
		class = strictest(targets)
	}
	fan.Targeted = len(targets)
	if a.PlanID == "" && len(targets) > a.MaxNodes {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, fmt.Sprintf(
			"max_nodes: the selector matches %d nodes, more than max_nodes %d; narrow the selector or raise max_nodes (at most 10000)",
			len(targets), a.MaxNodes))
	}
	checked, e := f.checkArguments(tenant, ref, targets, a.Arguments)
	if e != nil {
		return nil, e
	}
	if a.DryRun {
		return f.dryRun(ctx, c, ref, targets, class, argsDigest, selDigest)
	}
	if !c.claims.HasScope(auth.ScopeFor(class)) {
		return nil, schemas.NewError(schemas.CodeSafetyDenied, "token lacks scope "+auth.ScopeFor(class)+
			" for the strictest safety class of "+ref.pattern()+" among the nodes ("+class+")")
	}
	if classRank(class) > 0 && len(targets) > 1 && a.PlanID == "" {
		return nil, schemas.NewError(schemas.CodeSafetyDenied, fmt.Sprintf(
			"plan_id: a %s verb on %d nodes runs only a plan: call with dry_run true, read what it would do, "+
				"then call again with the same verb and arguments and its plan_id", class, len(targets)))
	}
	// A fan-out runs long enough that its caller may cancel it, or hang
	// up, from any replica.
	ctx, stop := c.g.cancels.cancellable(ctx, c.claims, c.rpcID)
	defer stop()
	run := &fanout{f: f, c: c, ref: ref, args: a.Arguments, class: class, targets: targets, checked: checked,
		maxResult: a.MaxResultBytes, progress: progressOf(ctx), audit: fan, budget: f.budgetFor(c.claims.Tenant, ref, targets)}
	return run.run(ctx, a.Concurrency, a.MaxTotalBytes, a.SummaryOnly, a.PlanID), nil
}

// msgNoPlan answers a plan_id that names no live plan of the caller's.
var msgNoPlan = "plan_id: no such plan, or it expired (a plan lasts " + bus.PlanTTL.String() + "): make a new dry run"

// plan reads a plan the caller may run.
func (f *fleet) plan(ctx context.Context, c *callCtx, id string) (*bus.Plan, *schemas.Error) {
	if f.plans == nil {
		return nil, schemas.NewError(schemas.CodeInternal, "plans unavailable on this gateway")
	}
	plan, err := f.plans.Get(ctx, id, time.Now())
	switch {
	case errors.Is(err, bus.ErrNoPlan):
		return nil, schemas.NewError(schemas.CodeSafetyDenied, msgNoPlan)
	case err != nil:
		c.g.log.Error("fleet.call plan", "plan_id", id, "err", err)
		return nil, schemas.NewError(schemas.CodeInternal, msgRegistryDown)
	case plan.Tenant != c.claims.Tenant || plan.Subject != c.claims.Subject:
		// Another caller's plan is no plan of this one's.
		return nil, schemas.NewError(schemas.CodeSafetyDenied, msgNoPlan)
	}
	return plan, nil
}

// checkArguments validates the arguments against the verb's input
// schema on every online target, each schema once, before anything is
// sent. It returns the schemas it checked. (Validators are comparable:
// a schema and a counter, by pointer.)
func (f *fleet) checkArguments(tenant string, ref verbRef, targets []target, args json.RawMessage) (map[validator]bool, *schemas.Error) {
	decoded, err := schemas.Decode(args)
	if err != nil {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
	}
	checked := map[validator]bool{}
	for _, t := range targets {
		e, _ := f.cat.lookup(tenant, ref.name(t.nodeID))
		if e == nil || checked[e.input] {
			continue
		}
		if err := e.input.validateValue(decoded); err != nil {
			return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments: "+e.input.explain(err))
		}
		checked[e.input] = true
	}
	return checked, nil
}

// dryRunDoc is a dry run's answer.
type dryRunDoc struct {
	DryRun      bool     `json:"dry_run"`
	Targeted    int      `json:"targeted"`
	Sample      []string `json:"sample"`
	SafetyClass string   `json:"safety_class"`
	PlanID      string   `json:"plan_id"`
	ExpiresAt   string   `json:"expires_at"`
}

// dryRun keeps the resolved nodes as a plan, and says what a run would
// do; it sends nothing.
func (f *fleet) dryRun(ctx context.Context, c *callCtx, ref verbRef, targets []target, class, args, sel string) (json.RawMessage, *schemas.Error) {
	if f.plans == nil {
		return nil, schemas.NewError(schemas.CodeInternal, "plans unavailable on this gateway")
	}
	plan := &bus.Plan{ID: strings.ToLower(ulid.Make().String()), Tenant: c.claims.Tenant, Subject: c.claims.Subject,
		Tool: ref.pattern(), Args: args, Selector: sel, Class: class, Nodes: make([]string, 0, len(targets)),
		ExpiresAt: time.Now().Add(bus.PlanTTL).UTC()}
	for _, t := range targets {
		plan.Nodes = append(plan.Nodes, t.nodeID)
	}
	if err := f.plans.Put(ctx, plan); err != nil {
		c.g.log.Error("fleet.call plan", "err", err)
		return nil, schemas.NewError(schemas.CodeInternal, msgRegistryDown)
	}
	c.ev.Fanout.PlanID = plan.ID
	doc := dryRunDoc{DryRun: true, Targeted: len(targets), Sample: plan.Nodes[:min(sampleSize, len(plan.Nodes))],
		SafetyClass: class, PlanID: plan.ID, ExpiresAt: plan.ExpiresAt.Format(time.RFC3339)}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, schemas.NewError(schemas.CodeInternal, "plan does not encode")
	}
	return out, nil
}

// progressKey carries, in a call's context, how to tell its caller of
// progress: set by the SDK's door when the caller sent a progressToken.
type progressKey struct{}

// progressFunc tells the caller that done of total are finished.
type progressFunc func(ctx context.Context, done, total int, message string)

// withProgress is ctx telling progress to the session of req, if it
// asked for it.
func withProgress(ctx context.Context, req *sdk.CallToolRequest) context.Context {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return ctx
	}
	s := req.Session
	return context.WithValue(ctx, progressKey{}, progressFunc(func(ctx context.Context, done, total int, message string) {
		_ = s.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token,
			Progress: float64(done), Total: float64(total), Message: message})
	}))
}

func progressOf(ctx context.Context) progressFunc {
	p, _ := ctx.Value(progressKey{}).(progressFunc)
	return p
}

// fanout is one run of fleet.call over its targets.
type fanout struct {
	f         *fleet
	c         *callCtx
	ref       verbRef
	args      json.RawMessage
	class     string // the strictest the run may call
	targets   []target
	checked   map[validator]bool // the input schemas checked before the run; read-only
	maxResult int
	progress  progressFunc // nil: the caller did not ask
	audit     *bus.FanoutAudit
	budget    time.Duration // the fan-out's, in all
}

// budgetFor is a fan-out's budget: --fleet-budget, or, when the verb is
// a local tool whose timeout on one of the targets is longer, that and
// a second (a 40 s restart on each node is no fleet timeout).
func (f *fleet) budgetFor(tenant string, ref verbRef, targets []target) time.Duration {
	budget := f.budget
	if local, _ := schemas.LookupKind(schemas.KindLocal); ref.short != local.Short {
		return budget
	}
	for _, t := range targets {
		n := f.devices.record(tenant, t.nodeID)
		if n == nil {
			continue
		}
		for _, c := range n.Capabilities {
			if c.CapID == ref.capID && c.Kind == schemas.KindLocal {
				budget = max(budget, time.Duration(c.Constraints.DeadlineMsDefault)*time.Millisecond+time.Second)
			}
		}
	}
	return budget
}

// row is one node's outcome, as its answer carries it.
type row struct {
	node string
	ok   bool
	code string // of a failure
	doc  []byte // the row, encoded
	sent bool   // a call went to the node
}

// run calls the targets, concurrency at once, within the fleet budget,
// and answers the rows as they finished, bounded, and the summary. A
// cancelled call sends nothing further.
func (r *fanout) run(caller context.Context, concurrency, maxTotal int, summaryOnly bool, planID string) json.RawMessage {
	ctx, cancel := context.WithTimeoutCause(caller, cmp.Or(r.budget, r.f.budget), errFleetBudget)
	defer cancel()
	rows := make(chan row, concurrency)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(concurrency, len(r.targets)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(r.targets) {
					return
				}
				rows <- r.one(ctx, r.targets[i].nodeID)
			}
		})
	}
	go func() { wg.Wait(); close(rows) }()

	var (
		okRows, failRows [][]byte
		sum              = summaryDoc{Targeted: len(r.targets), Failed: map[string]int{}}
		done             int
	)
	for rw := range rows {
		done++
		if rw.sent {
			r.audit.Sent++
		}
		if rw.ok {
			sum.OK++
			if !summaryOnly {
				okRows = append(okRows, rw.doc)
			} else {
				sum.Omitted++
			}
		} else {
			sum.Failed[rw.code]++
			failRows = append(failRows, rw.doc)
		}
		if r.progress != nil && caller.Err() == nil { // the last rows may come after the budget ran out
			msg := rw.node + " ok"
			if !rw.ok {
				msg = rw.node + " " + rw.code
			}
			r.progress(caller, done, len(r.targets), msg)
		}
	}
	r.audit.OK, r.audit.Failed = sum.OK, sum.Failed
	switch cause := context.Cause(ctx); {
	case cause == nil:
	case errors.Is(cause, errFleetBudget):
		r.audit.Ended = "budget"
	default:
		r.audit.Ended = "cancelled"
	}
	return fanAnswer(failRows, okRows, sum, maxTotal, planID)
}

// fanAnswer writes a run's answer: its rows, the failures first, then the
// successes, each in the order they finished, as many as maxTotal bytes
// of rows hold (the others counted in the summary's omitted: a bounded
// answer drops what went right before what went wrong), its summary and
// its plan.
func fanAnswer(failRows, okRows [][]byte, sum summaryDoc, maxTotal int, planID string) json.RawMessage {
	total := 0
	keep := func(docs [][]byte) [][]byte {
		var kept [][]byte
		for _, d := range docs {
			if total+len(d)+1 > maxTotal {
				sum.Omitted++
				continue
			}
			total += len(d) + 1
			kept = append(kept, d)
		}
		return kept
	}
	failRows = keep(failRows)
	okRows = keep(okRows)
	var out bytes.Buffer
	out.Grow(total + 256)
	out.WriteString(`{"results":[`)
	first := true
	for _, docs := range [][][]byte{failRows, okRows} {
		for _, d := range docs {
			if !first {
				out.WriteByte(',')
			}
			first = false
			out.Write(d)
		}
	}
	out.WriteString(`],"summary":`)
	s, _ := json.Marshal(sum)
	out.Write(s)
	if planID != "" {
		out.WriteString(`,"plan_id":`)
		out.WriteString(strconv.Quote(planID))
	}
	out.WriteByte('}')
	return out.Bytes()
}

// summaryDoc is a run's summary.
type summaryDoc struct {
	Targeted int            `json:"targeted"`
	OK       int            `json:"ok"`
	Failed   map[string]int `json:"failed"`
	Omitted  int            `json:"omitted,omitempty"`
}

// one calls the verb on one node, as a single call of its tool would go,
// with an audit event of its own naming the fan-out's request, and
// returns its row. A node the budget or a cancel left uncalled gets a
// row and no event: nothing was sent.
func (r *fanout) one(ctx context.Context, nodeID string) row {
	if ctx.Err() != nil {
		msg := "not called: the call was cancelled"
		if errors.Is(context.Cause(ctx), errFleetBudget) {
			msg = "not called: the fleet budget ran out first"
		}
		return failedRow(nodeID, schemas.NewError(schemas.CodeDeadlineExceeded, msg), false)
	}
	parent := r.c
	name := r.ref.name(nodeID)
	c := &callCtx{g: parent.g, start: time.Now(), claims: parent.claims, name: name,
		requestID: ulid.Make().String(), traceparent: parent.traceparent}
	c.ev = bus.AuditEvent{Actor: "gateway", RequestID: c.requestID, Parent: parent.requestID,
		Tenant: parent.claims.Tenant, Subject: parent.claims.Subject, JTI: parent.claims.ID, Tool: name, NodeID: nodeID}
	tenant := parent.claims.Tenant
	c.entry, _ = r.f.cat.lookup(tenant, name)
	e := c.entry
	switch {
	case e == nil:
		if n := r.f.devices.offlineNode(tenant, name); n != nil {
			return failedRow(nodeID, c.fail(schemas.CodeNodeOffline, "node is offline since "+n.LastSeen.Format(time.RFC3339)), false)
		}
		return failedRow(nodeID, c.fail(schemas.CodeToolNotFound, "no node of yours with this id has the verb"), false)
	case e.stream != nil || e.invoker == nil:
		return failedRow(nodeID, c.fail(schemas.CodeManifestInvalid, "the verb streams on this node"), false)
	case classRank(e.class) > classRank(r.class):
		return failedRow(nodeID, c.fail(schemas.CodeSafetyDenied,
			"the verb's safety class on this node is now "+e.class+", stricter than the plan's "+r.class), false)
	}
	e.origin.audit(&c.ev)
	if !r.checked[e.input] { // the node's tool changed since
		if err := e.input.validate(r.args); err != nil {
			return failedRow(nodeID, c.fail(schemas.CodeManifestInvalid, "arguments: "+e.input.explain(err)), false)
		}
	}
	result, env := c.unary(ctx, r.args)
	if env != nil {
		return failedRow(nodeID, env, true)
	}
	var b bytes.Buffer
	b.WriteString(`{"node_id":"`)
	b.WriteString(nodeID)
	if len(result) > r.maxResult {
		fmt.Fprintf(&b, `","ok":true,"result_truncated":{"bytes":%d,"limit":%d}}`, len(result), r.maxResult)
	} else {
		b.WriteString(`","ok":true,"result":`)
		b.Write(result)
		b.WriteByte('}')
	}
	return row{node: nodeID, ok: true, doc: b.Bytes(), sent: true}
}

// failedRow is a node's row of failure.
func failedRow(nodeID string, e *schemas.Error, sent bool) row {
	var b bytes.Buffer
	b.WriteString(`{"node_id":"`)
	b.WriteString(nodeID)
	b.WriteString(`","ok":false,"error":`)
	b.Write(e.JSON())
	b.WriteByte('}')
	return row{node: nodeID, code: e.Code, doc: b.Bytes(), sent: sent}
}
