package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// The catalog is the one place a tool is looked up: per tenant, every
// tool of every source (DESIGN.md §4, §8), each entry carrying what a
// call needs, decided when the tool is listed and not per call. Sources
// feed it under keys of their own; a device's tools are held by node
// instead (putNode), a node's entries made when a call or a list needs
// them, so that a fleet costs no entry and no name per tool. The
// three doors (fast path, SDK handler, REST/SSE) look a tool up once per
// call, run the same checks on the entry (call.go) and call its invoker,
// never asking which source it came from.

// shape is what the result of a successful call is.
type shape uint8

const (
	// shapeDocument: the tool's structured result, a JSON document the
	// gateway wraps as the CallToolResult's structuredContent and text
	// (devices).
	shapeDocument shape = iota
	// shapeToolResult: an MCP CallToolResult, passed through with the
	// gateway's _meta (upstreams), even when the tool marks it isError.
	shapeToolResult
)

// validator checks a JSON document against one schema of a tool.
type validator interface {
	validate(doc []byte) error
	// validateValue checks a document already decoded by schemas.Decode.
	validateValue(v any) error
	// explain says why validate refused a document, in words a caller
	// can act on and which never echo what the caller sent.
	explain(err error) string
}

// embedded is a schema of the embedded set, by $id (with its quick path).
type embedded struct {
	set *schemas.Set
	id  string
}

func (v embedded) validate(doc []byte) error { return v.set.ValidateJSON(v.id, doc) }
func (v embedded) validateValue(d any) error { return v.set.Validate(v.id, d) }
func (v embedded) explain(err error) string  { return v.set.Explain(v.id, err) }

// entry is one tool as the catalog holds it. Entries are read-only once
// put: a change is a new entry. A door calls an entry the same way
// whatever its source: check (call.go), then its invoker (or, for the
// rare tool that needs the caller's MCP session, its session call; for a
// stream, its opener).
type entry struct {
	// name is the canonical name (DESIGN.md §8): what the device wire,
	// audit events, metrics and error messages say.
	name string
	// safe is the name's listed form (schemas.SafeToolName), recorded by
	// the catalog when the entry is first put, and never parsed.
	safe  string
	class string // safety class
	scope string // the scope a caller needs (auth.ScopeFor(class))
	input validator
	// output checks a result, or each frame of a stream; nil: unchecked.
	output validator
	// shape says what a successful call's result is.
	shape shape
	// origin says what serves the tool, for the catalog and the audit;
	// one per owner, shared by its entries. Never nil.
	origin *origin
	// invoker runs a unary call of the tool; stream, when set, opens the
	// stream a call of a streaming tool answers with; session serves a
	// tool of okso's own that needs the caller's MCP session (it holds
	// the call open), through the SDK's door only.
	invoker invoker
	stream  opener
	session sessionCall
	// reports: the invoker tells the caller of its progress when asked
	// (fleet.call), which only the SDK's door, holding the caller's
	// session, can send.
	reports bool
	// desc is the tool as tools/list shows it under its canonical name,
	// its schemas as JSON documents; listed holds it under each form's
	// name (made when the entry is first put). A device's tool has
	// neither: lazy makes its descriptor when a list needs it, so that
	// tens of thousands of nodes hold none at rest.
	desc   *sdk.Tool
	listed [formCount]*sdk.Tool
	lazy   describer
}

// describer makes the descriptor of an entry that keeps none.
type describer interface {
	describe(e *entry, form nameForm) *sdk.Tool
}

// tool is the entry's descriptor as a list names it in form. Read-only.
func (e *entry) tool(form nameForm) *sdk.Tool {
	if e.lazy != nil {
		return e.lazy.describe(e, form)
	}
	return e.listed[form]
}

// listedName is the entry's name in form (the safe one is recorded when
// the entry is first put).
func (e *entry) listedName(form nameForm) string {
	if form == formSafe {
		return e.safe
	}
	return e.name
}

// origin is what serves an entry: its source, as unlisting names it, and
// its owner (a node, an upstream, a listen; none for okso's own tools),
// which audit events name.
type origin struct {
	source string
	// owner names what serves it ("node/<id>"…): two owners' tools
	// never share a name.
	owner string
	// As audit events and logs name the owner.
	nodeID, upstream, callerID string
}

// oksoOrigin is the origin of okso's own tools.
var oksoOrigin = &origin{source: sourceNameOkso}

// audit names the entry's owner in an audit event.
func (o *origin) audit(ev *bus.AuditEvent) {
	ev.NodeID, ev.Upstream, ev.Caller = o.nodeID, o.upstream, o.callerID
}

// attrs are the log attributes that name the entry's owner.
func (o *origin) attrs() []any {
	switch {
	case o.nodeID != "":
		return []any{"node_id", o.nodeID}
	case o.upstream != "":
		return []any{"upstream", o.upstream}
	case o.callerID != "":
		return []any{"caller_id", o.callerID}
	}
	return nil
}

// invoker runs the unary calls of an entry, once the door's checks
// passed (token, tool, scope, arguments: [callCtx.check]): it reaches
// what serves the tool and checks the result. It returns the result to
// answer, as the entry's shape says, or an error envelope already
// audited ([callCtx.fail]); the door audits a success.
type invoker interface {
	invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error)
}

// opener opens the stream that answers a call of a streaming tool, after
// the door's checks; on success the caller must close it. A nil stream
// with a nil error envelope is errQuota (the tenant's streams are all
// taken), audited already.
type opener interface {
	open(ctx context.Context, c *callCtx, args json.RawMessage) (*stream, *schemas.Error, error)
}

// nameForm is a form in which tools/list names tools (DESIGN.md §8).
type nameForm uint8

const (
	// formSafe: each dot of the canonical name a dash, which every agent
	// host accepts (^[A-Za-z0-9_-]{1,64}$). The default.
	formSafe nameForm = iota
	// formSeed: seed 000's dotted canonical form.
	formSeed
	formCount
)

// formOf is the form a token asks for, or else the gateway's.
func formOf(claim string, gateway nameForm) nameForm {
	switch claim {
	case auth.ToolNamesSafe:
		return formSafe
	case auth.ToolNamesSeed:
		return formSeed
	}
	return gateway
}

// perNode reports whether the entry is a per-node tool: one of a
// device's capabilities, as its source recorded when it was made (a
// name is never parsed for it).
func (e *entry) perNode() bool { return e.origin.source == sourceNameDevice }

// names are the names a call may use for the entry: its canonical name
// and its listed one (the same for names without a dot).
func (e *entry) names() []string {
	if e.safe == e.name {
		return []string{e.name}
	}
	return []string{e.name, e.safe}
}

// view is what one caller may see: a tenant's tools, filtered by the
// call scopes of the caller's token, named in one form, with or without
// the per-node tools. Each view has its own cached list (pages.go).
type view struct {
	tenant string
	scopes uint8 // scopeBit of every call scope the token grants
	form   nameForm
	// lean leaves the per-node tools ([entry.perNode]) out of the list
	// (DESIGN.md §8, --node-tools=false); they stay callable by name, and
	// fleet.nodes and okso.find_tools, which use views that are never
	// lean, still see them.
	lean bool
}

// scopeBit maps a call scope to its bit in view.scopes; 0 for none.
func scopeBit(scope string) uint8 {
	switch scope {
	case auth.ScopeReadOnly:
		return 1
	case auth.ScopeMutating:
		return 2
	case auth.ScopeDestructive:
		return 4
	}
	return 0
}

// viewOf is the view of a token's caller: form and nodeTools are the
// gateway's settings, for a token without a tool_names or node_tools
// claim (a claim wins).
func viewOf(c *auth.Claims, form nameForm, nodeTools bool) view {
	if c.NodeTools != nil {
		nodeTools = *c.NodeTools
	}
	v := view{tenant: c.Tenant, form: formOf(c.ToolNames, form), lean: !nodeTools}
	for _, s := range [...]string{auth.ScopeReadOnly, auth.ScopeMutating, auth.ScopeDestructive} {
		if c.HasScope(s) { // granted, or implied by a wider scope
			v.scopes |= scopeBit(s)
		}
	}
	return v
}

// allows reports whether the view lists a tool that needs scope.
func (v view) allows(scope string) bool {
	b := scopeBit(scope)
	return b != 0 && v.scopes&b != 0
}

// catalog holds every tenant's tools, the cached lists of their views,
// and an MCP server per tenant for its sessions. It is safe for
// concurrent use; the zero value is not: use newCatalog.
type catalog struct {
	newServer func() *sdk.Server
	// refused is told of each entry a put refused: one of its names is
	// another tool's (taken names it).
	refused func(e *entry, taken string)

	mu      sync.RWMutex
	tenants map[string]map[string]*entry // tenant → canonical and listed names → entry
	keys    map[string]keyed             // source key → what it put
	holders map[string]holders           // name → the tenants holding it
	// nodes hold the devices' tools by node, not by name (putNode): a
	// device tool's name carries its node id, so that one entry per
	// node answers both names of each of its tools. By node id, and by
	// tenant and node id.
	nodes   map[string]*nodeTool
	nodesOf map[string]map[string]*nodeTool
	// gens counts the changes of each tenant's tools, so that a list made
	// outside the lock is kept only if none came meanwhile.
	gens  map[string]uint64
	lists map[view]*toolList // made on a view's first tools/list after a change
	// last is each view's latest list, kept across changes, and journal
	// each tenant's changes since a change of any but nodes: the next
	// list of a view whose tenant's nodes only came and went since its
	// last is that one with those nodes' tools taken out and put back
	// (pages.go), not made again from all of them.
	last    map[view]*toolList
	journal map[string]*journal
	pages   pageCache              // the JSON of recent pages' tools
	servers map[string]*sdk.Server // by tenant, made on its first request
}

// anyTenant is the tenant of tools every tenant sees (an upstream
// configured for "*"); no tenant can be named so.
const anyTenant = "*"

// holders are the tenants holding one name: how many, and the canonical
// name of the tool it names (the same in each: a name is made of it).
type holders struct {
	n         int
	canonical string
}

// keyed is what one source key put in the catalog.
type keyed struct {
	tenant  string
	entries []*entry
}

func newCatalog(newServer func() *sdk.Server, refused func(e *entry, taken string)) *catalog {
	return &catalog{
		newServer: newServer,
		refused:   refused,
		tenants:   map[string]map[string]*entry{},
		keys:      map[string]keyed{},
		holders:   map[string]holders{},
		nodes:     map[string]*nodeTool{},
		nodesOf:   map[string]map[string]*nodeTool{},
		gens:      map[string]uint64{},
		lists:     map[view]*toolList{},
		last:      map[view]*toolList{},
		pages:     pageCache{max: maxPageBytes},
		journal:   map[string]*journal{},
		servers:   map[string]*sdk.Server{},
	}
}

// put makes entries the tools key holds for tenant (or for every tenant:
// anyTenant), replacing what key held before. An entry one of whose
// names (canonical or listed) another tool of the tenant holds already,
// or one put before it in entries, is refused: a call by that name could
// otherwise reach either. The tenant's sessions are told the list changed.
func (c *catalog) put(key, tenant string, entries []*entry) {
	var refused []*entry
	var taken []string
	var moved []*sdk.Server // of the tenant the key's tools leave
	c.mu.Lock()
	if old, had := c.keys[key]; had {
		c.forget(old)
		if old.tenant != tenant { // a node id freed and taken by another tenant
			c.changed(old.tenant)
			moved = c.serversOf(old.tenant)
		}
	}
	tools := c.tenants[tenant]
	if tools == nil {
		tools = map[string]*entry{}
		c.tenants[tenant] = tools
	}
	kept := make([]*entry, 0, len(entries))
	batch := map[string]bool{} // the names of kept
	for _, e := range entries {
		if e.safe == "" { // first put: no one else sees it yet
			e.safe = schemas.SafeToolName(e.name)
		}
		if e.listed[formSeed] == nil && e.lazy == nil {
			e.listed[formSeed] = e.desc
			e.listed[formSafe] = e.desc
			if e.safe != e.name {
				safe := *e.desc
				safe.Name = e.safe
				safe.Meta = maps.Clone(e.desc.Meta)
				if safe.Meta == nil {
					safe.Meta = sdk.Meta{}
				}
				safe.Meta[schemas.MetaName] = e.name
				e.listed[formSafe] = &safe
			}
		}
		name := c.taken(tenant, e)
		for _, n := range e.names() {
			if batch[n] {
				name = n
			}
		}
		if name != "" {
			refused, taken = append(refused, e), append(taken, name)
			continue
		}
		for _, n := range e.names() {
			if tools[n] == nil {
				c.holders[n] = holders{n: c.holders[n].n + 1, canonical: e.name}
			}
			tools[n] = e
			batch[n] = true
		}
		kept = append(kept, e)
	}
	c.keys[key] = keyed{tenant: tenant, entries: kept}
	c.changed(tenant)
	servers := c.serversOf(tenant)
	c.mu.Unlock()
	for i, e := range refused {
		c.refused(e, taken[i])
	}
	notify(servers)
	notify(moved)
}

// taken returns a name of e that another owner's tool, which e's tenant
// sees, holds already (mu is held); "" if none. A tool of the same owner
// is not another: a source puts its tools under a new key (an upstream
// configured for other tenants) before it drops the old one.
func (c *catalog) taken(tenant string, e *entry) string {
	return c.takenBy(tenant, e.owner(), e.names()...)
}

// takenBy returns the first of names that a tool of another owner than
// owner, which tenant sees, holds already (mu is held); "" if none.
func (c *catalog) takenBy(tenant, owner string, names ...string) string {
	other := func(x *entry) bool { return x != nil && x.owner() != owner }
	for _, n := range names {
		if other(c.tenants[tenant][n]) || tenant != anyTenant && other(c.tenants[anyTenant][n]) {
			return n
		}
		if tenant == anyTenant && c.holders[n].n > 0 {
			for _, tools := range c.tenants {
				if other(tools[n]) {
					return n
				}
			}
		}
		if node, _, _ := c.nodeToolOf(n); node != nil && node.from.owner != owner &&
			(tenant == anyTenant || node.rec.Tenant == tenant) {
			return n
		}
	}
	return ""
}

// putNode makes n's tools those its node holds for its tenant, replacing
// what the node held before (for any tenant: a node id freed and taken
// by another tenant leaves the first one's list). A tool one of whose
// names another owner's tool the tenant sees holds already, or an
// earlier tool of the node, is refused, as put refuses an entry; n.verbs
// keeps the others. The tenants' sessions are told their list changed.
func (c *catalog) putNode(n *nodeTool) {
	tenant := n.rec.Tenant
	var refused []*entry
	var taken []string
	var moved []*sdk.Server // of the tenant the node leaves
	c.mu.Lock()
	if old := c.nodes[n.nodeID]; old != nil {
		c.forgetNode(old)
		if old.rec.Tenant != tenant {
			c.changedNode(old.rec.Tenant, n.nodeID)
			moved = c.serversOf(old.rec.Tenant)
		}
	}
	kept := n.verbs[:0] // no one else sees n yet
	for _, v := range n.verbs {
		name := n.name(v)
		by := c.takenBy(tenant, n.from.owner, name, schemas.SafeToolName(name))
		for _, k := range kept {
			if k.cap == v.cap && k.tmpl.verb.Name == v.tmpl.verb.Name {
				by = name // a verb the capability names twice
			}
		}
		if by != "" {
			refused, taken = append(refused, n.entry(v, name)), append(taken, by)
			continue
		}
		kept = append(kept, v)
	}
	n.verbs = kept
	c.nodes[n.nodeID] = n
	if c.nodesOf[tenant] == nil {
		c.nodesOf[tenant] = map[string]*nodeTool{}
	}
	c.nodesOf[tenant][n.nodeID] = n
	c.changedNode(tenant, n.nodeID)
	servers := c.serversOf(tenant)
	c.mu.Unlock()
	for i, e := range refused {
		c.refused(e, taken[i])
	}
	notify(servers)
	notify(moved)
}

// dropNode removes every tool of a node.
func (c *catalog) dropNode(nodeID string) {
	c.mu.Lock()
	old := c.nodes[nodeID]
	if old == nil {
		c.mu.Unlock()
		return
	}
	c.forgetNode(old)
	c.changedNode(old.rec.Tenant, nodeID)
	servers := c.serversOf(old.rec.Tenant)
	c.mu.Unlock()
	notify(servers)
}

// forgetNode takes a node's tools out of the lookup maps; mu is held.
func (c *catalog) forgetNode(n *nodeTool) {
	delete(c.nodes, n.nodeID)
	byID := c.nodesOf[n.rec.Tenant]
	delete(byID, n.nodeID)
	if len(byID) == 0 {
		delete(c.nodesOf, n.rec.Tenant)
	}
}

// nodeToolOf returns the node whose tool name names, in either of its
// forms, the tool, and its canonical name; a nil node if none. mu is
// held. A canonical name has no dash and the listed form no dot
// (schemas.SafeToolName), so a name without a dot is read as the listed
// form, and parsed.
func (c *catalog) nodeToolOf(name string) (*nodeTool, nodeVerb, string) {
	canonical := name
	if !strings.Contains(name, ".") {
		canonical = strings.ReplaceAll(name, "-", ".")
	}
	t, ok := schemas.ParseToolName(canonical)
	if !ok {
		return nil, nodeVerb{}, ""
	}
	n := c.nodes[t.NodeID]
	if n == nil {
		return nil, nodeVerb{}, ""
	}
	v, ok := n.find(t)
	if !ok {
		return nil, nodeVerb{}, ""
	}
	return n, v, canonical
}

// owner names what serves the entry: its node, upstream, listen, or okso.
func (e *entry) owner() string {
	if e.origin.owner == "" {
		return "okso"
	}
	return e.origin.owner
}

// drop removes every tool key holds.
func (c *catalog) drop(key string) {
	c.mu.Lock()
	old, had := c.keys[key]
	if !had {
		c.mu.Unlock()
		return
	}
	c.forget(old)
	delete(c.keys, key)
	c.changed(old.tenant)
	servers := c.serversOf(old.tenant)
	c.mu.Unlock()
	notify(servers)
}

// forget takes k's tools out of the lookup maps; mu is held.
func (c *catalog) forget(k keyed) {
	tools := c.tenants[k.tenant]
	for _, e := range k.entries {
		for _, n := range e.names() {
			if tools[n] != e {
				continue // put again meanwhile, by another key
			}
			delete(tools, n)
			if h := c.holders[n]; h.n <= 1 {
				delete(c.holders, n)
			} else {
				h.n--
				c.holders[n] = h
			}
		}
	}
	if len(tools) == 0 {
		delete(c.tenants, k.tenant)
	}
}

// changed drops the cached lists a change of tenant's tools makes stale
// (every view's, for anyTenant); mu is held. The next list of the
// tenant's views is made from all of its tools.
func (c *catalog) changed(tenant string) {
	c.stale(tenant)
	c.journal[tenant] = &journal{from: c.gens[tenant]}
}

// changedNode is changed for a change of one node's tools only: the
// next list of the tenant's views may be its last one with that node's
// tools taken out and put back. mu is held.
func (c *catalog) changedNode(tenant, nodeID string) {
	c.stale(tenant)
	j := c.journal[tenant]
	if j == nil {
		j = &journal{from: c.gens[tenant] - 1} // none before: a list of an earlier gen is made again
		c.journal[tenant] = j
	}
	j.note(c.gens[tenant], nodeID)
}

func (c *catalog) stale(tenant string) {
	c.gens[tenant]++
	for v := range c.lists {
		if v.tenant == tenant || tenant == anyTenant {
			delete(c.lists, v)
		}
	}
}

// serversOf returns the servers of a tenant's sessions (of every tenant,
// for anyTenant); mu is held.
func (c *catalog) serversOf(tenant string) []*sdk.Server {
	if tenant != anyTenant {
		if srv := c.servers[tenant]; srv != nil {
			return []*sdk.Server{srv}
		}
		return nil
	}
	out := make([]*sdk.Server, 0, len(c.servers))
	for _, srv := range c.servers {
		out = append(out, srv)
	}
	return out
}

// lookup returns a tenant's tool by either of its names; when the tenant
// has none of that name, elsewhere is the canonical name of another
// tenant's tool it names ("" if none).
func (c *catalog) lookup(tenant, name string) (e *entry, elsewhere string) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e = c.tenants[tenant][name]; e != nil {
		return e, ""
	}
	if e = c.tenants[anyTenant][name]; e != nil {
		return e, ""
	}
	n, v, canonical := c.nodeToolOf(name)
	if n != nil && n.rec.Tenant == tenant {
		return n.entry(v, canonical), ""
	}
	if h := c.holders[name]; h.n > 0 {
		return nil, h.canonical
	}
	return nil, canonical
}

// server returns the MCP server of a tenant's sessions. It holds no
// tools: tools/list and tools/call are answered before it would
// ([Gateway.intercept]); it carries the sessions, and the list_changed
// notifications that reach them (notify).
func (c *catalog) server(tenant string) *sdk.Server {
	c.mu.RLock()
	srv := c.servers[tenant]
	c.mu.RUnlock()
	if srv != nil {
		return srv
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if srv = c.servers[tenant]; srv == nil {
		srv = c.newServer()
		c.servers[tenant] = srv
	}
	return srv
}

// changeMarker is the tool a server holds for an instant to tell its
// sessions the list changed: the SDK sends list_changed (debounced, to
// the sessions that subscribed, on every revision's channel) only when
// its own list changes. No one lists or calls it: the gateway answers
// both methods itself.
var changeMarker = &sdk.Tool{Name: "okso-list-changed", InputSchema: json.RawMessage(`{"type":"object"}`)}

// notify tells the sessions of servers that their tool list changed.
func notify(servers []*sdk.Server) {
	for _, srv := range servers {
		srv.AddTool(changeMarker, unreachable)
		srv.RemoveTools(changeMarker.Name)
	}
}

// errNotIntercepted would mean a tools/call reached the SDK's own handler.
var errNotIntercepted = errors.New("tools/call bypassed the gateway")

// unreachable is the handler registered with the SDK; [Gateway.intercept]
// answers every tools/call before the SDK would call it.
func unreachable(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	return nil, errNotIntercepted
}
