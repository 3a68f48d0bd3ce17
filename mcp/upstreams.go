package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// The upstream source of the catalog (upstreams): every gateway watches KV
// okso_remotes, where the remote tier keeps each healthy upstream's
// allowed tools (DESIGN.md §9.1), and lists them as {upstream}.{tool} for
// the tenants the upstream is configured for. A call goes to the
// upstream's subject, where any replica of the remote tier answers it;
// the gateway never reaches an upstream itself.

// upstreams is the upstream source. It is safe for concurrent use.
type upstreams struct {
	watched
	reg    *bus.Remotes
	feed   feed
	log    *slog.Logger
	budget time.Duration // the gateway's: an upstream's own timeout may only be shorter
	checks *atomic.Int64 // of foreign schemas

	mu     sync.Mutex
	listed map[string]*listedRemote // by upstream
}

func newUpstreams(reg *bus.Remotes, f feed, log *slog.Logger, budget time.Duration, checks *atomic.Int64) *upstreams {
	u := &upstreams{reg: reg, feed: f, log: log, budget: budget, checks: checks, listed: map[string]*listedRemote{}}
	u.w = newWatcher("upstream registry", u.watch, u.known,
		func(name string) { u.apply(bus.RemoteEvent{Upstream: name}, reasonVanished) })
	return u
}

// listedRemote is an upstream as the gateway lists it.
type listedRemote struct {
	rec  *bus.Remote
	keys []string // the catalog keys its tools are under, one per tenant
}

// droppedTools are the tools of an upstream's record that its next
// record no longer has.
func droppedTools(before, after *bus.Remote) []string {
	var gone []string
	for _, t := range before.Tools {
		if !slices.ContainsFunc(after.Tools, func(n bus.RemoteTool) bool { return n.Name == t.Name }) {
			gone = append(gone, t.Name)
		}
	}
	return gone
}

// remoteKey is the catalog key of an upstream's tools for one tenant.
func remoteKey(upstream, tenant string) string { return "remote/" + upstream + "/" + tenant }

// foreign is the validator of a schema okso did not write: an upstream's
// or a caller tool's. checks, when not nil, counts the checks it runs.
type foreign struct {
	f      *schemas.Foreign
	checks *atomic.Int64
}

func (v foreign) validate(doc []byte) error {
	v.count()
	return v.f.ValidateJSON(doc)
}

func (v foreign) validateValue(d any) error {
	v.count()
	return v.f.Validate(d)
}

func (v foreign) explain(err error) string { return v.f.Explain(err) }

func (v foreign) count() {
	if v.checks != nil {
		v.checks.Add(1)
	}
}

// watch runs one watch of okso_remotes.
func (u *upstreams) watch(ctx context.Context, seen func(string), ready func()) error {
	return u.reg.Watch(ctx, func(ev bus.RemoteEvent) {
		if ev.Initial {
			seen(ev.Upstream)
		}
		u.apply(ev, goneReason(ev.Expired, ev.Invalid))
	}, ready)
}

// known are the upstreams the source lists.
func (u *upstreams) known() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Collect(maps.Keys(u.listed))
}

// apply folds one change of okso_remotes into the catalog; gone is
// why, when the change takes the upstream away.
func (u *upstreams) apply(ev bus.RemoteEvent, gone string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := u.listed[ev.Upstream]
	if ev.Remote != nil && old != nil && old.rec.SameListing(ev.Remote) {
		return // a refresh, or another replica's identical record
	}
	var keys []string
	if ev.Remote != nil && !(ev.Remote.Upstream == ev.Upstream && schemas.ValidUpstream(ev.Upstream)) {
		gone = reasonRefused
	}
	listing := ev.Remote != nil && gone != reasonRefused
	if !listing && (old != nil || gone == reasonRefused) { // a refused record is said even when it listed nothing
		u.feed.unlisted(sourceNameUpstream, gone, "upstream", ev.Upstream)
	}
	if listing {
		entries := u.project(ev.Remote)
		if old != nil {
			if gone := droppedTools(old.rec, ev.Remote); len(gone) > 0 {
				u.feed.unlisted(sourceNameUpstream, reasonDropped, "upstream", ev.Upstream, "tools", gone)
			}
		}
		for _, tenant := range remoteTenants(ev.Remote.Tenants) {
			key := remoteKey(ev.Upstream, tenant)
			u.feed.put(key, tenant, entries)
			keys = append(keys, key)
		}
		u.listed[ev.Upstream] = &listedRemote{rec: ev.Remote, keys: keys}
		u.log.Debug("upstream listed", "upstream", ev.Upstream, "tools", len(entries), "tenants", ev.Remote.Tenants)
	} else {
		delete(u.listed, ev.Upstream)
	}
	if old != nil {
		var tenants []string
		for _, key := range old.keys {
			if !slices.Contains(keys, key) {
				u.feed.drop(key)
				tenants = append(tenants, strings.TrimPrefix(key, remoteKey(ev.Upstream, "")))
			}
		}
		if listing && len(tenants) > 0 {
			u.feed.unlisted(sourceNameUpstream, reasonDropped, "upstream", ev.Upstream, "tenants", tenants)
		}
	}
	if old != nil || len(keys) > 0 {
		u.feed.changed()
	}
}

// remoteTenants returns the tenants an upstream's tools are listed for:
// anyTenant alone when "*" is among them, else the valid ones.
func remoteTenants(tenants []string) []string {
	if slices.Contains(tenants, anyTenant) {
		return []string{anyTenant}
	}
	var valid []string
	for _, t := range tenants {
		if schemas.ValidTenant(t) && !slices.Contains(valid, t) {
			valid = append(valid, t)
		}
	}
	return valid
}

// project builds the catalog entries of an upstream's record: a
// tool per allowed tool, named {upstream}.{tool}, its schemas compiled
// once here. The remote tier refuses what cannot be listed; the gateway
// checks again (anything may write a KV bucket) and leaves such a tool
// out, saying so in its log.
func (u *upstreams) project(rec *bus.Remote) []*entry {
	budget := u.budget
	if t := time.Duration(rec.TimeoutMs) * time.Millisecond; t > 0 && t < budget {
		budget = t
	}
	var entries []*entry
	seen := map[string]bool{}
	for _, t := range rec.Tools {
		e, err := u.entry(rec.Upstream, t, budget)
		if err == nil && seen[e.name] {
			err = fmt.Errorf("listed twice")
		}
		if err != nil {
			u.feed.unlisted(sourceNameUpstream, reasonToolRefused, "upstream", rec.Upstream, "err", err)
			continue
		}
		seen[e.name] = true
		entries = append(entries, e)
	}
	return entries
}

// entry is one upstream tool as the catalog holds it.
func (u *upstreams) entry(upstream string, t bus.RemoteTool, budget time.Duration) (*entry, error) {
	name, err := schemas.RemoteToolName(upstream, t.Name)
	if err != nil {
		return nil, err
	}
	switch t.Safety {
	case schemas.SafetyReadOnly, schemas.SafetyMutating, schemas.SafetyDestructive:
	default:
		return nil, fmt.Errorf("tool %s has no safety class", name)
	}
	if err := schemas.ValidToolSchema(t.InputSchema); err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	in, err := schemas.CompileForeign(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("tool %s: input %w", name, err)
	}
	e := &entry{
		name:    name,
		class:   t.Safety,
		scope:   auth.ScopeFor(t.Safety),
		input:   foreign{in, u.checks},
		shape:   shapeToolResult,
		origin:  &origin{source: sourceNameUpstream, owner: "upstream/" + upstream, upstream: upstream},
		invoker: &upstreamTool{subject: bus.RemoteCall(upstream), budget: budget},
	}
	st := &sdk.Tool{
		Name:        name,
		Title:       t.Title,
		Description: schemas.TrimDescription(t.Description),
		InputSchema: t.InputSchema,
		Annotations: &sdk.ToolAnnotations{
			Title:          t.Title,
			ReadOnlyHint:   t.Safety == schemas.SafetyReadOnly,
			IdempotentHint: t.Idempotent,
		},
		Meta: sdk.Meta{
			schemas.MetaUpstream:    upstream,
			schemas.MetaSafetyClass: t.Safety,
		},
	}
	if len(t.OutputSchema) > 0 {
		out, err := schemas.CompileForeign(t.OutputSchema)
		if err == nil {
			err = schemas.ValidToolSchema(t.OutputSchema)
		}
		if err != nil {
			return nil, fmt.Errorf("tool %s: output %w", name, err)
		}
		e.output = foreign{out, u.checks}
		st.OutputSchema = t.OutputSchema
	}
	// The class is the operator's; the upstream's own hints are not
	// trusted (DESIGN.md §9.1).
	if t.Safety == schemas.SafetyDestructive {
		yes := true
		st.Annotations.DestructiveHint = &yes
	} else if t.Safety != schemas.SafetyReadOnly {
		no := false
		st.Annotations.DestructiveHint = &no
	}
	e.desc = st
	if err := sdkAccepts(st); err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	return e, nil
}

// upstreamTool invokes the tools of one upstream: on its subject, where
// any replica of the remote tier answers.
type upstreamTool struct {
	subject string
	budget  time.Duration
}

func (u *upstreamTool) invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	rep, e := c.request(ctx, args, hop{subject: u.subject, budget: u.budget, offline: "upstream is offline: no remote tier serves it"})
	if e != nil {
		return nil, e
	}
	return c.checkToolResult(rep.Result)
}

// sdkAccepts reports whether the SDK's server takes the tool: AddTool
// panics on what it refuses, and an upstream's tool must never take a
// gateway down. Tried on a server of its own, once per listing.
func sdkAccepts(t *sdk.Tool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the MCP SDK refuses it: %v", r)
		}
	}()
	sdk.NewServer(&sdk.Implementation{Name: "okso-check"}, nil).AddTool(t, unreachable)
	return nil
}

// checkToolResult checks an upstream's (or a relayed) CallToolResult and
// returns it as the gateway answers it. It is a JSON object of the
// members the remote tier passes on, content, structuredContent and
// isError (no _meta: the tier drops the upstream's; no resultType: the
// gateway writes its own), whose structuredContent, unless the upstream
// marks the result isError (the tool's own answer, passed through),
// passes the tool's output schema when it has one. The SDK's path
// decodes the content into the SDK's types and writes those, while the
// fast path writes the result as it is: so a result is returned as it
// came only in the plain form the SDK writes as it is (see plainResult),
// and otherwise with its content as the SDK writes it, or refused when
// the SDK cannot decode it.
func checkToolResult(result []byte, output validator) (json.RawMessage, error) {
	v, err := schemas.Decode(result)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a JSON object")
	}
	for k := range m {
		switch k {
		case "content", "structuredContent", "isError":
		default:
			return nil, fmt.Errorf("carries %s", strconv.Quote(k))
		}
	}
	if !plainResult(m) {
		if result, err = sdkToolResult(result); err != nil {
			return nil, err
		}
	}
	if isErr, _ := m["isError"].(bool); isErr || output == nil {
		return result, nil
	}
	sc, ok := m["structuredContent"]
	if !ok {
		return nil, fmt.Errorf("no structuredContent, which the output schema needs")
	}
	if f, ok := output.(foreign); ok {
		return result, f.validateValue(sc) // decoded already
	}
	b, err := json.Marshal(sc)
	if err != nil {
		return nil, err
	}
	return result, output.validate(b)
}

// plainResult reports whether the SDK writes a decoded result m (see
// checkToolResult) as it came, but for white space, escapes and the order
// of members: content a list of text blocks of a type and a text only,
// isError absent or true, structuredContent absent or not null (it goes
// on as it came on either path).
func plainResult(m map[string]any) bool {
	content, ok := m["content"].([]any)
	if !ok {
		return false
	}
	for _, c := range content {
		block, _ := c.(map[string]any)
		if _, isText := block["text"].(string); len(block) != 2 || block["type"] != "text" || !isText {
			return false
		}
	}
	if isErr, ok := m["isError"]; ok && isErr != true {
		return false
	}
	if sc, ok := m["structuredContent"]; ok && sc == nil {
		return false
	}
	return true
}

// sdkToolResult returns a result with its content as the SDK decodes and
// writes it, its structuredContent as it came, and isError when true.
func sdkToolResult(result []byte) (json.RawMessage, error) {
	var res sdk.CallToolResult
	if err := json.Unmarshal(result, &res); err != nil {
		return nil, fmt.Errorf("the MCP SDK cannot read it: %w", err)
	}
	var raw struct {
		StructuredContent json.RawMessage `json:"structuredContent"`
	}
	if err := json.Unmarshal(result, &raw); err != nil {
		return nil, err
	}
	if res.Content == nil {
		res.Content = []sdk.Content{}
	}
	content, err := json.Marshal(res.Content)
	if err != nil {
		return nil, fmt.Errorf("the MCP SDK cannot write it: %w", err)
	}
	out := append([]byte(`{"content":`), content...)
	if len(raw.StructuredContent) > 0 && string(raw.StructuredContent) != "null" {
		out = append(out, `,"structuredContent":`...)
		out = append(out, raw.StructuredContent...)
	}
	if res.IsError {
		out = append(out, `,"isError":true`...)
	}
	return append(out, '}'), nil
}
