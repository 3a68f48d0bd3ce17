package mcp

import (
	"encoding/base64"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// tools/list is answered from okso's own lists, one per view (tenant ×
// scopes × name form × per-node tools), made on the view's first request after a change
// and kept until the next: sorted by listed name and paged by a cursor
// that names the last tool of the page before, so a page follows the one
// before it even when the list changed in between (as the SDK's own
// lists do). No SDK server holds a copy of every tool of every view.

// pageSize is how many tools one tools/list page holds (the SDK's default).
const pageSize = 1000

// toolList is one view's tools, sorted by listed name. Read-only once made.
type toolList struct {
	form    nameForm // the view's, in which the tools are named
	names   []string
	entries []*entry // of names, in their order; described only for a page
	// hits are the list's search index (okso.find_tools), made once on
	// the first search of the list (fleet.go).
	once sync.Once
	hits []*hit
}

// list returns a view's tools, from the cache or made now. Its tools are
// gathered under the read lock (the nodes', whose entries are made only
// now, after it) and sorted under none, so that a view of tens of
// thousands of tools holds no call's lookup; it is kept only if no
// change came meanwhile (the next request makes it again otherwise).
func (c *catalog) list(v view) *toolList {
	c.mu.RLock()
	if l := c.lists[v]; l != nil {
		c.mu.RUnlock()
		return l
	}
	gen, genAll := c.gens[v.tenant], c.gens[anyTenant]
	own := c.tenants[v.tenant]
	type named struct {
		name string // listed, inline for the sort
		e    *entry
	}
	var all []named
	for _, tenant := range [...]string{v.tenant, anyTenant} {
		for name, e := range c.tenants[tenant] {
			if name != e.name || !v.allows(e.scope) || v.lean && e.perNode() { // once per entry
				continue
			}
			if tenant == anyTenant && (own[e.name] != nil || own[e.safe] != nil) {
				continue // the tenant's own, of the same owner, while it moves between keys
			}
			all = append(all, named{e.listedName(v.form), e})
		}
	}
	var nodes []*nodeTool // read-only once put: their entries are made outside the lock
	if !v.lean {
		nodes = make([]*nodeTool, 0, len(c.nodesOf[v.tenant]))
		for _, n := range c.nodesOf[v.tenant] {
			nodes = append(nodes, n)
		}
	}
	c.mu.RUnlock()
	for _, n := range nodes {
		for _, nv := range n.verbs {
			if v.allows(nv.tmpl.scope) {
				e := n.entry(nv, n.name(nv))
				all = append(all, named{e.listedName(v.form), e})
			}
		}
	}
	slices.SortFunc(all, func(a, b named) int { return strings.Compare(a.name, b.name) })
	l := &toolList{form: v.form, entries: make([]*entry, len(all)), names: make([]string, len(all))}
	for i, n := range all {
		l.entries[i], l.names[i] = n.e, n.name
	}
	c.mu.Lock()
	if c.gens[v.tenant] == gen && c.gens[anyTenant] == genAll {
		c.lists[v] = l
	}
	c.mu.Unlock()
	return l
}

// page answers one tools/list request of a view: the page after cursor
// ("" for the first), and the cursor of the next ("" after the last).
func (c *catalog) page(v view, cursor string) (*sdk.ListToolsResult, error) {
	l := c.list(v)
	start := 0
	if cursor != "" {
		last, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(last) == 0 {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor: pass the nextCursor of the page before"}
		}
		start, _ = slices.BinarySearch(l.names, string(last))
		if start < len(l.names) && l.names[start] == string(last) {
			start++
		}
	}
	end := min(start+pageSize, len(l.entries))
	res := &sdk.ListToolsResult{Tools: make([]*sdk.Tool, 0, max(end-start, 0))} // [], not null
	for _, e := range l.entries[start:max(end, start)] {
		res.Tools = append(res.Tools, e.tool(l.form))
	}
	if end < len(l.entries) {
		res.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(l.names[end-1]))
	}
	// Per tenant and scope, and changing as devices come and go.
	res.CacheScope, res.TTLMs = "private", 0
	return res, nil
}
