package mcp

import (
	"bytes"
	"cmp"
	"container/list"
	"encoding/base64"
	"encoding/json"
	"fmt"
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
	// ends are the ends of its pages (bound), the last the list's length.
	ends []int
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
	c.mu.RLock()
	l.bound(c.last[v])
	c.mu.RUnlock()
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
// Its tools are JSON from the catalog's page cache while the page holds
// the same tools, encoded now otherwise.
func (c *catalog) page(v view, cursor string) (*listedPage, error) {
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
	end := l.pageEnd(start)
	res := &listedPage{ListToolsResult: &sdk.ListToolsResult{}}
	if end < len(l.entries) {
		res.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(l.names[end-1]))
	}
	// Per tenant and scope, and changing as devices come and go.
	res.CacheScope, res.TTLMs = "private", 0
	key := pageKey{v, cursor}
	entries := l.entries[start:end]
	if res.tools = c.pages.get(key, entries); res.tools == nil {
		tools := make([]*sdk.Tool, len(entries))
		for i, e := range entries {
			tools[i] = e.tool(l.form)
		}
		var err error
		if res.tools, err = json.Marshal(tools); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "a tool does not encode: " + err.Error()}
		}
		c.pages.put(key, entries, res.tools)
	}
	return res, nil
}

// listedPage is a tools/list page as the gateway answers it: the SDK's
// result for everything but the tools (the SDK sets resultType and
// _meta on it for the clients that need them), and the tools as JSON.
type listedPage struct {
	*sdk.ListToolsResult
	tools json.RawMessage // a JSON array; the embedded result's Tools are unused
}

// MarshalJSON writes the page as the SDK writes a ListToolsResult,
// whose last member is "tools".
func (p *listedPage) MarshalJSON() ([]byte, error) {
	r := *p.ListToolsResult
	r.Tools = []*sdk.Tool{}
	head, err := json.Marshal(&r)
	if err != nil {
		return nil, err
	}
	const empty = `"tools":[]}`
	if !bytes.HasSuffix(head, []byte(empty)) {
		return nil, fmt.Errorf("a tools/list result ends with %q, not with its tools", head[max(len(head)-20, 0):])
	}
	out := make([]byte, 0, len(head)+len(p.tools))
	out = append(out, head[:len(head)-len(empty)+len(`"tools":`)]...)
	out = append(out, p.tools...)
	return append(out, '}'), nil
}

// Pages have stable bounds: a list brought forward or made again keeps
// the last name of each page of the view's last list as a page's end,
// so that a node that comes or goes changes the one page its tools are
// on, and the cached pages after it stay valid (a page's bytes are
// cached by view and cursor, the last name of the page before). A page
// that grows past pageSize is split in parts of equal size, a page under
// a quarter of it is merged with the next when both fit in one.

// pageEnd is the end of the page that starts at start: the first bound
// after it, at most pageSize tools on.
func (l *toolList) pageEnd(start int) int {
	i, _ := slices.BinarySearch(l.ends, start+1)
	end := len(l.entries)
	if i < len(l.ends) {
		end = l.ends[i]
	}
	return min(end, start+pageSize)
}

// bound sets the list's page ends from the last names of the pages of
// last, the view's list before (none: pages of pageSize).
func (l *toolList) bound(last *toolList) {
	var cuts []int // ends of pages, from last's bounds
	if last != nil {
		for _, end := range last.ends {
			if end == len(last.names) {
				break
			}
			i, found := slices.BinarySearch(l.names, last.names[end-1])
			if found {
				i++
			}
			if i > 0 && (len(cuts) == 0 || i > cuts[len(cuts)-1]) {
				cuts = append(cuts, i)
			}
		}
	}
	cuts = append(cuts, len(l.names))
	l.ends = l.ends[:0]
	start := 0
	for k, end := range cuts {
		if end <= start {
			continue
		}
		if n := end - start; n < pageSize/4 && k+1 < len(cuts) && cuts[k+1]-start <= pageSize {
			continue // merged with the next
		}
		if n := end - start; n > pageSize {
			parts := (n + pageSize - 1) / pageSize
			if last == nil {
				for start+pageSize < end { // a list's first pages: full ones
					start += pageSize
					l.ends = append(l.ends, start)
				}
			} else {
				for p := 1; p < parts; p++ {
					l.ends = append(l.ends, start+n*p/parts)
				}
			}
		}
		l.ends = append(l.ends, end)
		start = end
	}
}

// pageKey is a cached page: a view's page after a cursor.
type pageKey struct {
	v      view
	cursor string
}

// pageCache holds the JSON of the tools of recent pages, up to max bytes,
// the least recently used going first.
type pageCache struct {
	mu      sync.Mutex
	max     int
	size    int
	encoded int                       // pages encoded (not found, or stale), for the tests
	pages   map[pageKey]*list.Element // of *cachedPage
	lru     list.List                 // most recent first
}

type cachedPage struct {
	key     pageKey
	entries []*entry // the page's tools: the bytes hold while it has these
	tools   []byte
}

// maxPageBytes bounds the page cache: about 30 pages of device tools
// (with their schemas), a fleet of 10,000 nodes listed by two views.
const maxPageBytes = 64 << 20

// cost is what a cached page holds in memory.
func (p *cachedPage) cost() int { return len(p.tools) + 8*len(p.entries) + len(p.key.cursor) + 64 }

// get returns the page's tools as JSON if they are cached for exactly
// entries, nil otherwise.
func (pc *pageCache) get(k pageKey, entries []*entry) []byte {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	el := pc.pages[k]
	if el == nil {
		return nil
	}
	p := el.Value.(*cachedPage)
	if !slices.Equal(p.entries, entries) {
		return nil
	}
	pc.lru.MoveToFront(el)
	return p.tools
}

// put caches the JSON of a page's tools, entries.
func (pc *pageCache) put(k pageKey, entries []*entry, tools []byte) {
	p := &cachedPage{key: k, entries: slices.Clone(entries), tools: tools}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.encoded++
	if pc.pages == nil {
		pc.pages = map[pageKey]*list.Element{}
	}
	if el := pc.pages[k]; el != nil {
		pc.size -= el.Value.(*cachedPage).cost()
		pc.lru.Remove(el)
	}
	if p.cost() > pc.max {
		delete(pc.pages, k)
		return
	}
	pc.pages[k] = pc.lru.PushFront(p)
	pc.size += p.cost()
	for pc.size > pc.max {
		old := pc.lru.Back()
		pc.lru.Remove(old)
		delete(pc.pages, old.Value.(*cachedPage).key)
		pc.size -= old.Value.(*cachedPage).cost()
	}
}
