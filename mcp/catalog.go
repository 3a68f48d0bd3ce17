package mcp

import (
	"context"
	"errors"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/schemas"
)

// The catalog is the one place a tool is looked up: per tenant, every
// tool of every source (DESIGN.md §4, §8), each entry carrying what a
// call needs, decided when the tool is listed and not per call. Sources
// feed it under keys of their own (devices.go: one key per node); the
// three doors (fast path, SDK handler, REST/SSE) look a tool up once per
// call and run the same checks on the entry (call.go).

// source says where a tool comes from; their names cannot collide
// (DESIGN.md §8).
type source uint8

const (
	sourceDevice   source = iota + 1 // {kind_short}.{node_id}.{cap_id}.{verb}
	sourceUpstream                   // {upstream}.{tool}
	sourceCaller                     // {caller_id}_{tool}
	sourceOkso                       // okso's own: fleet.*, caller_tools_*
)

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
// put: a change is a new entry.
type entry struct {
	name   string
	source source
	class  string // safety class
	scope  string // the scope a caller needs (auth.ScopeFor(class))
	input  validator
	// output checks a result, or each frame of a stream; nil: unchecked.
	output validator
	// stream: the call answers with a stream of frames until cancelled.
	stream bool
	// shape says what a successful call's result is.
	shape shape
	// nodeID is the node of a device tool: its results and frames must
	// name it.
	nodeID string
	// upstream is the federated upstream of an upstream's tool.
	upstream string
	// subject is the NATS subject that serves a call.
	subject string
	// budget bounds a call (0: the gateway's).
	budget time.Duration
	// listenID is the listen serving a caller's tool, callerID its
	// caller (callers.go).
	listenID, callerID string
	// local serves a tool of okso's own on the gateway itself that
	// streams, through the SDK's door only; serve one that answers once,
	// through every door (its result a document, as a device's).
	local localCall
	serve unaryCall
	// desc is the tool as tools/list shows it.
	desc *sdk.Tool
}

// view is what one caller may see: a tenant's tools, filtered by the
// call scopes of the caller's token. Each view has its own cached server.
type view struct {
	tenant string
	scopes uint8 // scopeBit of every call scope the token grants
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

func viewOf(c *auth.Claims) view {
	v := view{tenant: c.Tenant}
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

// catalog holds every tenant's tools and the MCP servers of their views.
// It is safe for concurrent use; the zero value is not: use newCatalog.
type catalog struct {
	newServer func() *sdk.Server

	// sdkMu orders the changes made to the SDK servers: a source's put or
	// drop, and the filling of a new view, each hold it throughout, so a
	// view never misses a change nor sees one twice.
	sdkMu sync.Mutex

	mu      sync.RWMutex
	tenants map[string]map[string]*entry // tenant → name → entry
	keys    map[string]keyed             // source key → what it put
	holders map[string]int               // name → tenants listing it
	views   map[view]*sdk.Server         // made on a caller's first request
}

// anyTenant is the tenant of tools every tenant sees (an upstream
// configured for "*"); no tenant can be named so.
const anyTenant = "*"

// keyed is what one source key put in the catalog.
type keyed struct {
	tenant  string
	entries []*entry
}

func newCatalog(newServer func() *sdk.Server) *catalog {
	return &catalog{
		newServer: newServer,
		tenants:   map[string]map[string]*entry{},
		keys:      map[string]keyed{},
		holders:   map[string]int{},
		views:     map[view]*sdk.Server{},
	}
}

// put makes entries the tools key holds for tenant (or for every tenant:
// anyTenant), replacing what key held before. The entries are visible to
// lookups only once every view of the tenant lists them.
func (c *catalog) put(key, tenant string, entries []*entry) {
	c.sdkMu.Lock()
	defer c.sdkMu.Unlock()
	c.mu.RLock()
	old, had := c.keys[key]
	c.mu.RUnlock()
	if had {
		c.unlist(old)
	}
	for v, srv := range c.viewsOf(tenant) {
		for _, e := range entries {
			if v.allows(e.scope) {
				srv.AddTool(e.desc, unreachable)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if had {
		c.forget(old)
	}
	tools := c.tenants[tenant]
	if tools == nil {
		tools = map[string]*entry{}
		c.tenants[tenant] = tools
	}
	for _, e := range entries {
		if tools[e.name] == nil {
			c.holders[e.name]++
		}
		tools[e.name] = e
	}
	c.keys[key] = keyed{tenant: tenant, entries: entries}
}

// drop removes every tool key holds.
func (c *catalog) drop(key string) {
	c.sdkMu.Lock()
	defer c.sdkMu.Unlock()
	c.mu.RLock()
	old, had := c.keys[key]
	c.mu.RUnlock()
	if !had {
		return
	}
	c.unlist(old)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(old)
	delete(c.keys, key)
}

// unlist takes k's tools out of its tenant's views; sdkMu is held.
func (c *catalog) unlist(k keyed) {
	for v, srv := range c.viewsOf(k.tenant) {
		var names []string
		for _, e := range k.entries {
			if v.allows(e.scope) {
				names = append(names, e.name)
			}
		}
		if len(names) > 0 {
			srv.RemoveTools(names...)
		}
	}
}

// forget takes k's tools out of the lookup maps; mu is held.
func (c *catalog) forget(k keyed) {
	tools := c.tenants[k.tenant]
	for _, e := range k.entries {
		if tools[e.name] != e {
			continue // put again meanwhile, by another key
		}
		delete(tools, e.name)
		if c.holders[e.name]--; c.holders[e.name] <= 0 {
			delete(c.holders, e.name)
		}
	}
	if len(tools) == 0 {
		delete(c.tenants, k.tenant)
	}
}

// viewsOf returns the servers of a tenant's views (of every view, for
// anyTenant).
func (c *catalog) viewsOf(tenant string) map[view]*sdk.Server {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m := map[view]*sdk.Server{}
	for v, srv := range c.views {
		if v.tenant == tenant || tenant == anyTenant {
			m[v] = srv
		}
	}
	return m
}

// lookup returns a tenant's tool by name; when the tenant has none of
// that name, elsewhere says whether another tenant has.
func (c *catalog) lookup(tenant, name string) (e *entry, elsewhere bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e = c.tenants[tenant][name]; e != nil {
		return e, false
	}
	if e = c.tenants[anyTenant][name]; e != nil {
		return e, false
	}
	return nil, c.holders[name] > 0
}

// server returns the cached MCP server of a view, filled with the tools
// of its tenant that it allows.
func (c *catalog) server(v view) *sdk.Server {
	c.mu.RLock()
	srv := c.views[v]
	c.mu.RUnlock()
	if srv != nil {
		return srv
	}
	c.sdkMu.Lock()
	defer c.sdkMu.Unlock()
	c.mu.Lock()
	if srv = c.views[v]; srv != nil {
		c.mu.Unlock()
		return srv
	}
	srv = c.newServer()
	c.views[v] = srv
	var descs []*sdk.Tool
	for _, tenant := range [...]string{v.tenant, anyTenant} {
		for _, e := range c.tenants[tenant] {
			if v.allows(e.scope) {
				descs = append(descs, e.desc)
			}
		}
	}
	c.mu.Unlock()
	for _, d := range descs {
		srv.AddTool(d, unreachable)
	}
	return srv
}

// errNotIntercepted would mean a tools/call reached the SDK's own handler.
var errNotIntercepted = errors.New("tools/call bypassed the gateway")

// unreachable is the handler registered with the SDK; [Gateway.intercept]
// answers every tools/call before the SDK would call it.
func unreachable(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	return nil, errNotIntercepted
}
