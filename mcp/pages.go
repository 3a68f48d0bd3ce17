package mcp

import (
	"cmp"
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
	// gen and genAll are the changes of the view's tenant and of every
	// tenant's tools it was made at.
	gen, genAll uint64
	form        nameForm // the view's, in which the tools are named
	names       []string
	entries     []*entry // of names, in their order; described only for a page
	// nodes are the node ids of per-node tools, "" for the others, in
	// the same order: what with reads, without a look at each entry.
	nodes []string
	// hits are the list's search index (okso.find_tools), made once on
	// the first search of the list (fleet.go).
	once sync.Once
	hits []*hit
}

// list returns a view's tools, from the cache or made now: from the
// view's last list when only nodes came and went since (with), from all
// of the tenant's tools otherwise (made). Either is made outside the
// lock, so that a view of tens of thousands of tools holds no call's
// lookup, and kept only if no change came meanwhile (the next request
// makes it again otherwise).
func (c *catalog) list(v view) *toolList {
	c.mu.RLock()
	if l := c.lists[v]; l != nil {
		c.mu.RUnlock()
		return l
	}
	gen, genAll := c.gens[v.tenant], c.gens[anyTenant]
	var l *toolList
	if prev := c.last[v]; prev != nil && prev.genAll == genAll {
		if ids, ok := c.journal[v.tenant].since(prev.gen); ok {
			var nodes []*nodeTool // their tools now; read-only once put
			if !v.lean {
				for id := range ids {
					if n := c.nodesOf[v.tenant][id]; n != nil {
						nodes = append(nodes, n)
					}
				}
			}
			c.mu.RUnlock()
			l = prev.with(v, ids, nodes)
		}
	}
	if l == nil {
		l = c.made(v) // unlocks
	}
	l.gen, l.genAll = gen, genAll
	c.mu.Lock()
	if c.gens[v.tenant] == gen && c.gens[anyTenant] == genAll {
		c.lists[v] = l
	}
	if last := c.last[v]; last == nil || last.gen < gen || last.genAll < genAll {
		if len(c.last) >= maxViews && last == nil {
			clear(c.last) // views come with tokens' scopes and forms: a few, unless something is odd
		}
		c.last[v] = l
	}
	c.mu.Unlock()
	return l
}

// maxViews bounds the views whose last list the catalog keeps.
const maxViews = 1024

// named is a tool of a list being made: its listed name, inline for the
// sort, and its entry.
type named struct {
	name string
	e    *entry
	node string // of a per-node tool
}

// made makes a view's list from all of the tools it sees. The read
// lock is held, and released.
func (c *catalog) made(v view) *toolList {
	own := c.tenants[v.tenant]
	var all []named
	for _, tenant := range [...]string{v.tenant, anyTenant} {
		for name, e := range c.tenants[tenant] {
			if name != e.name || !v.allows(e.scope) || v.lean && e.perNode() { // once per entry
				continue
			}
			if tenant == anyTenant && (own[e.name] != nil || own[e.safe] != nil) {
				continue // the tenant's own, of the same owner, while it moves between keys
			}
			all = append(all, named{e.listedName(v.form), e, ""})
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
	all = appendNodes(all, v, nodes)
	slices.SortFunc(all, func(a, b named) int { return strings.Compare(a.name, b.name) })
	l := &toolList{form: v.form, entries: make([]*entry, len(all)), names: make([]string, len(all)), nodes: make([]string, len(all))}
	for i, n := range all {
		l.entries[i], l.names[i], l.nodes[i] = n.e, n.name, n.node
	}
	return l
}

// appendNodes appends the tools of nodes the view lists.
func appendNodes(all []named, v view, nodes []*nodeTool) []named {
	for _, n := range nodes {
		for _, nv := range n.verbs {
			if v.allows(nv.tmpl.scope) {
				e := n.entry(nv, n.name(nv))
				all = append(all, named{e.listedName(v.form), e, n.nodeID})
			}
		}
	}
	return all
}

// with is the list with the tools of the nodes ids taken out, and those
// of nodes, their tools now, put in: the list of the view once those
// nodes came, changed or went.
func (l *toolList) with(v view, ids map[string]bool, nodes []*nodeTool) *toolList {
	add := appendNodes(nil, v, nodes)
	slices.SortFunc(add, func(a, b named) int { return strings.Compare(a.name, b.name) })
	n := len(l.names) + len(add)
	out := &toolList{form: l.form, names: make([]string, 0, n), entries: make([]*entry, 0, n), nodes: make([]string, 0, n)}
	put := func(name string, e *entry, node string) {
		out.names, out.entries, out.nodes = append(out.names, name), append(out.entries, e), append(out.nodes, node)
	}
	i := 0
	for k, node := range l.nodes {
		if node != "" && ids[node] {
			continue // the node's tools before
		}
		for ; i < len(add) && add[i].name < l.names[k]; i++ {
			put(add[i].name, add[i].e, add[i].node)
		}
		put(l.names[k], l.entries[k], node)
	}
	for ; i < len(add); i++ {
		put(add[i].name, add[i].e, add[i].node)
	}
	return out
}

// journal is the changes of one tenant's tools that were of nodes only,
// since gen from: the nodes each change was of.
type journal struct {
	from    uint64
	changes []nodeChange
}

type nodeChange struct {
	gen    uint64
	nodeID string
}

// maxJournal bounds a journal: past it, the older half is dropped, and
// a list older than what is left is made again from all of its tools.
const maxJournal = 4096

func (j *journal) note(gen uint64, nodeID string) {
	if len(j.changes) >= maxJournal {
		drop := len(j.changes) / 2
		j.from = j.changes[drop-1].gen
		j.changes = slices.Delete(j.changes, 0, drop)
	}
	j.changes = append(j.changes, nodeChange{gen, nodeID})
}

// since returns the nodes changed after gen, and whether the journal
// has every change after it (none at all is no change: a nil journal).
func (j *journal) since(gen uint64) (map[string]bool, bool) {
	if j == nil {
		return nil, true
	}
	if gen < j.from {
		return nil, false
	}
	i, _ := slices.BinarySearchFunc(j.changes, gen+1, func(c nodeChange, g uint64) int { return cmp.Compare(c.gen, g) })
	if i == len(j.changes) {
		return nil, true
	}
	ids := make(map[string]bool, len(j.changes)-i)
	for _, c := range j.changes[i:] {
		ids[c.nodeID] = true
	}
	return ids, true
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
