package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// The caller-tool relay (DESIGN.md §9.3): an agent declares tools it
// implements itself with caller_tools_listen, a call that stays open as
// the push channel; the other agents of its tenant, on any replica, list
// them as {caller_id}_{tool} and call them like any tool. The replica
// holding the listen claims the caller id for the listener's agent in
// KV okso_callers (one agent holds it at a time, on every replica),
// writes the declaration there and serves
// okso.v1.caller.<listen_id>.req: each relayed call is pushed to the
// listener, which answers with caller_tool_response on any replica
// (forwarded on okso.v1.caller.<listen_id>.resp to the holder).

// callers is the caller source and both sides of the relay: the
// declarations it lists (KV okso_callers), the relayed calls waiting on
// this gateway for an answer (waits: the caller side), and the listens
// this gateway holds (held: the holder side; each holds its waiting
// calls). It is safe for concurrent use.
type callers struct {
	watched
	callersConfig

	mu    sync.Mutex
	decls map[string]*listedCaller // by listen id
	waits relayWaits
	held  heldListens
}

// callersConfig is what the caller source takes of the gateway.
type callersConfig struct {
	nc       *nats.Conn
	bucket   *bus.Callers
	relayers []bus.Role // see Options.Relayers
	// timeout bounds a relayed call, budget a forwarded response, ping
	// the time between pings on a listen.
	timeout, budget, ping time.Duration
	checks                *atomic.Int64 // of foreign schemas
	feed                  feed
	log                   *slog.Logger
	tracer                *tracing.Tracer // nil: off
	// Of the gateway: a call's context that its caller may cancel from
	// any replica, whether a token was revoked, and the tenant's stream
	// slots (a listen holds one).
	cancellable func(ctx context.Context, claims *auth.Claims, id []byte) (context.Context, func())
	revoked     func(*auth.Claims) bool
	takeSlot    func(tenant string) bool
	releaseSlot func(tenant string)
}

// newCallers returns the caller source, with the relay's own tools
// (caller_tools_listen, caller_tool_response) in the catalog for every
// tenant.
func newCallers(cfg callersConfig) (*callers, error) {
	s := &callers{callersConfig: cfg, decls: map[string]*listedCaller{},
		waits: relayWaits{byListen: map[string]map[*relayWait]struct{}{}}, held: heldListens{byID: map[string]*listen{}}}
	s.w = newWatcher("caller registry", s.watch, s.known,
		func(id string) { s.apply(bus.CallerEvent{ListenID: id}, reasonVanished) })
	relay, err := s.relayEntries()
	if err != nil {
		return nil, err
	}
	s.feed.put("okso/caller", anyTenant, relay)
	return s, nil
}

// callerKey is the catalog key of one listen's tools.
func callerKey(listenID string) string { return "caller/" + listenID }

// listedCaller is a declaration as the gateway lists it.
type listedCaller struct {
	rec    *bus.Caller
	listed bool // its tools are in the catalog (it is the latest of its caller id)
}

// watch runs one watch of okso_callers.
func (s *callers) watch(ctx context.Context, seen func(string), ready func()) error {
	return s.bucket.Watch(ctx, func(ev bus.CallerEvent) {
		if ev.Initial {
			seen(ev.ListenID)
		}
		s.apply(ev, goneReason(ev.Expired, ev.Invalid))
	}, ready)
}

// known are the declarations the gateway knows.
func (s *callers) known() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.decls))
}

// apply folds one change of okso_callers into the catalog; gone is
// why, when the change takes the declaration away. Of two live
// declarations of one caller id in one tenant (a listen replacing
// another, before the older is gone), only the later is listed.
func (s *callers) apply(ev bus.CallerEvent, gone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.decls[ev.ListenID]
	rec := ev.Caller
	if rec != nil && (!schemas.ValidTenant(rec.Tenant) || !validCallerID(rec.CallerID)) {
		rec, gone = nil, reasonRefused
	}
	if rec == nil && (gone == reasonRefused || old != nil && old.listed) { // a refused record is said even when it listed nothing
		s.feed.unlisted(sourceNameCaller, gone, "listen_id", ev.ListenID)
	}
	if rec != nil && old != nil && old.rec.Since.Equal(rec.Since) {
		return // a lease refresh
	}
	changed := false
	if old != nil && old.listed {
		s.feed.drop(callerKey(ev.ListenID))
		changed = true
	}
	if rec == nil {
		delete(s.decls, ev.ListenID)
		s.waits.end(ev.ListenID)
		// An older declaration of the same caller id may be listed again.
		if old != nil {
			if next := s.latest(old.rec.Tenant, old.rec.CallerID); next != nil && !next.listed {
				s.list(next)
			}
		}
		if changed {
			s.feed.changed()
		}
		return
	}
	lc := &listedCaller{rec: rec}
	s.decls[ev.ListenID] = lc
	if latest := s.latest(rec.Tenant, rec.CallerID); latest == lc {
		for id, other := range s.decls {
			if other != lc && other.listed && other.rec.Tenant == rec.Tenant && other.rec.CallerID == rec.CallerID {
				s.feed.drop(callerKey(id))
				other.listed = false
				s.feed.unlisted(sourceNameCaller, reasonReplaced, "listen_id", id, "by", ev.ListenID)
			}
		}
		s.list(lc)
		changed = true
	}
	if changed {
		s.feed.changed()
	}
}

// listenOf returns the listen whose tools the source lists for a caller
// id in a tenant; "" when none.
func (s *callers) listenOf(tenant, callerID string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lc := s.latest(tenant, callerID); lc != nil && lc.listed {
		return lc.rec.ListenID
	}
	return ""
}

// ListenView is a read-only look at a gateway's caller source
// ([Gateway.Listens]); without Options.Callers it sees no listen. It is
// safe for concurrent use.
type ListenView struct{ s *callers }

// Of returns the listen whose tools the gateway lists for a caller id in
// a tenant; "" when none.
func (v ListenView) Of(tenant, callerID string) string {
	if v.s == nil {
		return ""
	}
	return v.s.listenOf(tenant, callerID)
}

// validCallerID reports whether id can name a caller: okso's own
// namespaces (caller_tools_listen…) cannot be taken.
func validCallerID(id string) bool { return callerIDPattern.MatchString(id) && !schemas.IsReserved(id) }

// latest returns the latest live declaration of a caller id in a
// tenant; s.mu is held.
func (s *callers) latest(tenant, callerID string) *listedCaller {
	var latest *listedCaller
	for _, lc := range s.decls {
		if lc.rec.Tenant == tenant && lc.rec.CallerID == callerID && (latest == nil || lc.rec.Since.After(latest.rec.Since)) {
			latest = lc
		}
	}
	return latest
}

// list puts a declaration's tools in the catalog; s.mu is held.
func (s *callers) list(lc *listedCaller) {
	var entries []*entry
	for _, t := range lc.rec.Tools {
		e, err := s.entry(lc.rec, t)
		if err != nil {
			s.feed.unlisted(sourceNameCaller, reasonToolRefused, "listen_id", lc.rec.ListenID, "err", err)
			continue
		}
		entries = append(entries, e)
	}
	s.feed.put(callerKey(lc.rec.ListenID), lc.rec.Tenant, entries)
	lc.listed = true
}

// entry is one declared tool as the catalog holds it.
func (s *callers) entry(rec *bus.Caller, t bus.CallerTool) (*entry, error) {
	if !callerToolPattern.MatchString(t.Name) {
		return nil, fmt.Errorf("tool name %q", t.Name)
	}
	name := rec.CallerID + "_" + t.Name
	if err := schemas.ValidToolSchema(t.InputSchema); err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	in, err := schemas.CompileForeign(t.InputSchema)
	if err != nil {
		return nil, fmt.Errorf("tool %s: input %w", name, err)
	}
	class := schemas.SafetyMutating
	if t.ReadOnly {
		class = schemas.SafetyReadOnly
	}
	no := false
	st := &sdk.Tool{
		Name:        name,
		Description: schemas.TrimDescription(t.Description),
		InputSchema: t.InputSchema,
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: t.ReadOnly},
		Meta:        sdk.Meta{schemas.MetaSafetyClass: class, metaCaller: rec.CallerID},
	}
	if !t.ReadOnly {
		st.Annotations.DestructiveHint = &no
	}
	if err := sdkAccepts(st); err != nil {
		return nil, fmt.Errorf("tool %s: %w", name, err)
	}
	return &entry{
		name:    name,
		class:   class,
		scope:   auth.ScopeFor(class),
		input:   foreign{in, s.checks},
		shape:   shapeToolResult,
		origin:  &origin{source: sourceNameCaller, owner: callerKey(rec.ListenID), callerID: rec.CallerID},
		invoker: &relayedTool{s: s, listenID: rec.ListenID, subject: bus.CallerReq(rec.ListenID), budget: s.timeout},
		desc:    st,
	}, nil
}

// relayedTool invokes the tools of one listen: on the listen's subject,
// where the replica holding it pushes each call to the listener.
type relayedTool struct {
	s                 *callers
	listenID, subject string
	budget            time.Duration
}

// invoke relays a call and waits for the listener's answer: at most the
// budget, less if the caller cancels it (from any replica, by whichever
// door it came in) or the listen ends (E_NODE_OFFLINE at once). A call
// given up is withdrawn from the listener.
func (t *relayedTool) invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	ctx, stop := t.s.cancellable(ctx, c.claims, c.rpcID)
	defer stop()
	ctx, done := t.s.waits.wait(ctx, t.listenID)
	defer done()
	relayID := strings.ToLower(ulid.Make().String())
	h := hop{subject: t.subject, budget: t.budget, offline: "the caller's listen ended", header: nats.Header{}}
	h.header.Set(bus.HeaderRelayID, relayID)
	h.gaveUp = func() { t.s.withdraw(t.listenID, relayID, c.claims.Tenant) }
	rep, e := c.request(ctx, args, h)
	if e != nil {
		return nil, e
	}
	return c.checkToolResult(rep.Result)
}

// metaCaller names, in a relayed tool's _meta, the caller that serves it.
const metaCaller = "io.okso/caller"

// relayWait is one relayed call waiting on this gateway for its answer.
type relayWait struct{ cancel context.CancelCauseFunc }

// relayWaits are the relayed calls waiting on this gateway for their
// answers, by listen id: the caller side's one registry. Safe for
// concurrent use.
type relayWaits struct {
	mu       sync.Mutex
	byListen map[string]map[*relayWait]struct{}
}

// wait registers a relayed call to listenID; its context ends with
// errOwnerGone if the listen's declaration goes away first.
func (r *relayWaits) wait(ctx context.Context, listenID string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &relayWait{cancel: cancel}
	r.mu.Lock()
	set := r.byListen[listenID]
	if set == nil {
		set = map[*relayWait]struct{}{}
		r.byListen[listenID] = set
	}
	set[w] = struct{}{}
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		delete(set, w)
		if len(set) == 0 && r.byListen[listenID] != nil && len(r.byListen[listenID]) == 0 {
			delete(r.byListen, listenID)
		}
		r.mu.Unlock()
		cancel(nil)
	}
}

// end ends every relayed call to listenID waiting on this gateway.
func (r *relayWaits) end(listenID string) {
	r.mu.Lock()
	var ws []*relayWait
	for w := range r.byListen[listenID] {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		w.cancel(errOwnerGone)
	}
}

// withdraw tells the replica holding a listen that a relayed call was
// given up (its caller cancelled, left or ran out of budget).
func (s *callers) withdraw(listenID, relayID, tenant string) {
	msg := &nats.Msg{Subject: bus.CallerResp(listenID), Header: nats.Header{}}
	msg.Header.Set(bus.HeaderControl, bus.ControlCancelled)
	msg.Header.Set(bus.HeaderRelayID, relayID)
	msg.Header.Set(bus.HeaderTenant, tenant)
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Debug("withdraw relayed call", "listen_id", listenID, "err", err)
	}
}
