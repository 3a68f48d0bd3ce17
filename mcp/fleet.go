package mcp

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// The fleet tools (DESIGN.md §8, issue 30) are okso's own: fleet.nodes
// finds nodes of the caller's tenant, okso.find_tools searches every
// tool the caller may call. Both answer from the gateway's own state
// (the device source's presence memory, the catalog's cached lists),
// never touching a device, so any replica answers the same.

// The fleet tools' canonical names.
const (
	ToolFleetNodes = "fleet.nodes"
	ToolFindTools  = "okso.find_tools"
	ToolFleetCall  = "fleet.call"
)

// Bounds of the fleet tools' pages: their schemas' defaults.
const (
	defaultNodesLimit = 100
	defaultFindLimit  = 20
)

// fleet serves the fleet tools. It holds no state of its own: it reads
// the device source and the catalog, each under its own lock, and keeps
// fleet.call's plans in NATS.
type fleet struct {
	devices *devices
	cat     *catalog
	form    nameForm      // the gateway's, for tokens that do not say
	plans   *bus.Plans    // nil: fleet.call makes and runs no plan
	budget  time.Duration // of a whole fan-out
}

// addFleet puts the fleet tools in the catalog for every tenant.
func addFleet(f feed, fl *fleet, set *schemas.Set) error {
	if fl.budget <= 0 {
		fl.budget = DefaultFleetBudget
	}
	var entries []*entry
	for _, t := range []struct {
		name, title, desc, in, out string
		serve                      unaryCall
		class                      string // as listed: what the tool itself may do
	}{
		{ToolFleetNodes, "Find nodes of your fleet",
			"Lists the nodes of your tenant that match every filter given (kind, cap_id, verb, agent, name, labels, " +
				"node_id_prefix, node_ids, presence): each with its presence, name, labels, agent, when it connected or was " +
				"last seen, and its tools. Ordered by node id and paged (limit, cursor); total counts every match. " +
				"Answers from the gateway's memory, without reaching any device.",
			schemas.FleetNodesInput, schemas.FleetNodesOutput, fl.nodes, schemas.SafetyReadOnly},
		{ToolFindTools, "Search the tools you may call",
			"Searches every tool you may call, from every source (devices, federated upstreams, other clients, okso), " +
				"by words in its name, title and description, and by source or kind; best matches first, paged. " +
				"Answers full descriptors. The same tool on many nodes is one result, a template with the node count, " +
				"which fleet.call reaches on all of them.",
			schemas.FindToolsInput, schemas.FindToolsOutput, fl.findTools, schemas.SafetyReadOnly},
		{ToolFleetCall, "Call one verb on many nodes",
			"Calls one verb of your devices, with one arguments object, on every node a selector picks (the filters " +
				"of fleet.nodes; none: every online node with the verb), concurrency at once, and answers a row per node " +
				"(ok with its result, or its error) and a summary. Name the verb by tool (sysecho.*.echo.invoke, from " +
				"okso.find_tools) or by kind, cap_id and verb. More matches than max_nodes is an error, never a cut. " +
				"dry_run answers how many nodes, a sample and the strictest safety class, and a plan_id; a mutating or " +
				"destructive verb on more than one node runs only such a plan, with the same verb and arguments. " +
				"Needs the scope of the strictest class among the nodes. Each finished node is a progress notification " +
				"when you send a progressToken.",
			schemas.FleetCallInput, schemas.FleetCallOutput, fl.call, schemas.SafetyDestructive},
	} {
		in, ok := set.Standalone(t.in)
		out, ok2 := set.Standalone(t.out)
		if !ok || !ok2 {
			return fmt.Errorf("fleet tool %s: no schema %s or %s", t.name, t.in, t.out)
		}
		st := &sdk.Tool{
			Name: t.name, Title: t.title, Description: t.desc, InputSchema: in, OutputSchema: out,
			Annotations: &sdk.ToolAnnotations{Title: t.title, ReadOnlyHint: t.class == schemas.SafetyReadOnly},
			Meta:        sdk.Meta{schemas.MetaSafetyClass: t.class},
		}
		if t.class != schemas.SafetyReadOnly {
			// It may be anything its verbs are: the run checks the
			// scope of the strictest among its nodes (fleetcall.go).
			yes := true
			st.Annotations.DestructiveHint = &yes
		}
		if err := sdkAccepts(st); err != nil {
			return fmt.Errorf("fleet tool %s: %w", t.name, err)
		}
		entries = append(entries, &entry{
			name: t.name,
			// Every caller may call a fleet tool: fleet.call checks the
			// scope its verb needs among the nodes it reaches.
			class:   schemas.SafetyReadOnly,
			scope:   auth.ScopeReadOnly,
			reports: t.name == ToolFleetCall,
			input:   embedded{set, t.in},
			output:  embedded{set, t.out},
			shape:   shapeDocument,
			origin:  oksoOrigin,
			invoker: t.serve,
			desc:    st,
		})
	}
	f.put("okso/fleet", anyTenant, entries)
	return nil
}

// nodesArgs are fleet.nodes' arguments, once they passed their schema.
type nodesArgs struct {
	Kind         string            `json:"kind"`
	CapID        string            `json:"cap_id"`
	Verb         string            `json:"verb"`
	Agent        string            `json:"agent"`
	Name         string            `json:"name"`
	Labels       map[string]string `json:"labels"`
	NodeIDPrefix string            `json:"node_id_prefix"`
	NodeIDs      []string          `json:"node_ids"`
	Presence     string            `json:"presence"`
	Limit        int               `json:"limit"`
	Cursor       string            `json:"cursor"`
}

// match reports whether a node's record passes every filter but
// presence and node_ids.
func (a *nodesArgs) match(n *bus.Node) bool {
	if a.Agent != "" && n.Agent.Name != a.Agent ||
		a.Name != "" && n.Name != a.Name ||
		a.NodeIDPrefix != "" && !strings.HasPrefix(n.NodeID, a.NodeIDPrefix) {
		return false
	}
	for k, v := range a.Labels {
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	if a.Kind == "" && a.CapID == "" && a.Verb == "" {
		return true
	}
	for _, c := range n.Capabilities { // one capability must match all three
		if (a.Kind == "" || c.Kind == a.Kind) && (a.CapID == "" || c.CapID == a.CapID) &&
			(a.Verb == "" || slices.Contains(c.Verbs, a.Verb)) {
			return true
		}
	}
	return false
}

// nodeDoc is one node of fleet.nodes' answer.
type nodeDoc struct {
	NodeID      string            `json:"node_id"`
	Presence    string            `json:"presence"`
	Name        string            `json:"name,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Agent       schemas.Agent     `json:"agent"`
	ConnectedAt string            `json:"connected_at,omitempty"`
	LastSeen    string            `json:"last_seen,omitempty"`
	Tools       []string          `json:"tools"`
}

// nodesDoc is fleet.nodes' answer.
type nodesDoc struct {
	Nodes      []nodeDoc `json:"nodes"`
	Total      int       `json:"total"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// nodes serves fleet.nodes: the matching nodes of the caller's tenant
// are gathered under the device source's read lock (records are
// read-only once stored), then sorted and paged under none.
func (f *fleet) nodes(_ context.Context, c *callCtx, raw json.RawMessage) (json.RawMessage, *schemas.Error) {
	var a nodesArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
	}
	if a.Limit == 0 {
		a.Limit = defaultNodesLimit
	}
	matches := f.devices.matching(c.claims.Tenant, &a)
	start := 0
	if a.Cursor != "" {
		start, _ = slices.BinarySearchFunc(matches, a.Cursor, func(x found, id string) int { return strings.Compare(x.n.NodeID, id) })
		if start < len(matches) && matches[start].n.NodeID == a.Cursor {
			start++
		}
	}
	end := min(start+a.Limit, len(matches))
	v := viewOf(c.claims, f.form, true)
	v.lean = false // every node's tools, listed or not, whatever the token's node_tools
	doc := nodesDoc{Nodes: make([]nodeDoc, 0, end-start), Total: len(matches)}
	for _, m := range matches[start:end] {
		doc.Nodes = append(doc.Nodes, describeNode(f.devices.kindTable(), m.n, m.offline, v))
	}
	if end < len(matches) {
		doc.NextCursor = matches[end-1].n.NodeID
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, schemas.NewError(schemas.CodeInternal, "nodes do not encode")
	}
	return out, nil
}

// found is a node a selector matched, online or offline.
type found struct {
	n       *bus.Node
	offline bool
}

// matching returns the nodes of tenant that pass every filter of a, in
// node id order: gathered under the source's read lock (records are
// read-only once stored), sorted under none.
func (d *devices) matching(tenant string, a *nodesArgs) []found {
	online, offline := a.Presence != "offline", a.Presence == "offline" || a.Presence == "any"
	var matches []found
	consider := func(id string) {
		// A node both listed and offline (an instant while it leaves,
		// or its offline record came while it was probed) is offline:
		// that record is the later.
		if n := d.offline[id]; n != nil {
			if offline && n.Tenant == tenant && a.match(n) {
				matches = append(matches, found{n, true})
			}
			return
		}
		if n := d.nodes[id]; n != nil && online && n.Tenant == tenant && a.match(n) {
			matches = append(matches, found{n, false})
		}
	}
	d.mu.RLock()
	switch {
	case a.NodeIDs != nil:
		for _, id := range a.NodeIDs { // unique: the schema says so
			consider(id)
		}
	default:
		// Each map walked once, each record read where it lies.
		if online {
			for id, n := range d.nodes {
				if n.Tenant == tenant && (len(d.offline) == 0 || d.offline[id] == nil) && a.match(n) {
					matches = append(matches, found{n, false})
				}
			}
		}
		if offline {
			for _, n := range d.offline {
				if n.Tenant == tenant && a.match(n) {
					matches = append(matches, found{n, true})
				}
			}
		}
	}
	d.mu.RUnlock()
	slices.SortFunc(matches, func(x, y found) int { return strings.Compare(x.n.NodeID, y.n.NodeID) })
	return matches
}

// record returns the record of a node of tenant, online or remembered
// offline; nil for none.
func (d *devices) record(tenant, nodeID string) *bus.Node {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := d.offline[nodeID]
	if n == nil {
		n = d.nodes[nodeID]
	}
	if n == nil || n.Tenant != tenant {
		return nil
	}
	return n
}

// describeNode is a node as fleet.nodes answers it, its tools those the
// view may call, named in its form. A name or labels that break their
// rules (which no tier writes) are left out rather than repeated.
func describeNode(kt *schemas.KindTable, n *bus.Node, offline bool, v view) nodeDoc {
	doc := nodeDoc{NodeID: n.NodeID, Presence: bus.StateOnline, Agent: n.Agent, Tools: []string{}}
	if offline {
		doc.Presence = bus.StateOffline
		if !n.LastSeen.IsZero() {
			doc.LastSeen = n.LastSeen.UTC().Format(time.RFC3339Nano)
		}
	}
	if !n.ConnectedAt.IsZero() {
		doc.ConnectedAt = n.ConnectedAt.UTC().Format(time.RFC3339Nano)
	}
	if schemas.ValidNodeName(n.Name) {
		doc.Name = n.Name
	}
	if len(n.Labels) > 0 && schemas.CheckLabels(n.Labels) == nil {
		doc.Labels = n.Labels
	}
	tools, err := kt.Project(n.NodeID, n.Capabilities)
	if err != nil {
		return doc
	}
	for _, t := range tools {
		if !v.allows(auth.ScopeFor(t.Class)) {
			continue
		}
		name := t.Name
		if v.form == formSafe {
			name = schemas.SafeToolName(name)
		}
		doc.Tools = append(doc.Tools, name)
	}
	return doc
}

// findArgs are okso.find_tools' arguments, once they passed their schema.
type findArgs struct {
	Query  string `json:"query"`
	Source string `json:"source"`
	Kind   string `json:"kind"`
	Limit  int    `json:"limit"`
	Cursor string `json:"cursor"`
}

// hit is one result okso.find_tools can give: a tool, or a template of
// the same device tool on many nodes. Read-only once its view's index
// is made.
type hit struct {
	e *entry // the tool, or the template's first by name
	// strict is a template's tool of the strictest class (e, but for a
	// verb whose class differs by node: a local tool's is its operator's):
	// what the template says of its class and hints.
	strict *entry
	name   string // in the view's form; a template's pattern
	nodes  int    // > 0: a template of this many nodes' tools
	kind   string
	// lower-case, for matching: name (in both forms), title, description.
	lname, ltitle, ldesc string
	title, desc          string
}

// index is a view's search index: its tools, a device tool's nodes
// grouped into one hit per template, in the order of the view's list.
// Made once per cached list, on the first search after a change, so
// that tools/list computes nothing for it.
func (l *toolList) index(form nameForm) []*hit {
	l.once.Do(func() {
		// A device tool's name around its node id: "sysecho." and
		// ".echo.invoke" (substrings, not copies).
		type around struct{ before, after string }
		byPattern := map[around]*hit{}
		for _, e := range l.entries {
			kind := ""
			if t, ok := e.lazy.(*verbTemplate); ok {
				kind = t.kind
			}
			at := strings.Index(e.name, "."+e.origin.nodeID+".")
			if e.origin.source != sourceNameDevice || e.origin.nodeID == "" || at < 0 {
				l.hits = append(l.hits, newHit(e, e.listedName(form), kind, 0))
				continue
			}
			key := around{e.name[:at+1], e.name[at+1+len(e.origin.nodeID):]}
			if h := byPattern[key]; h != nil {
				h.nodes++
				if classRank(e.class) > classRank(h.strict.class) {
					h.strict = e
				}
				continue
			}
			h := newHit(e, nameIn(key.before+"*"+key.after, form), kind, 1)
			byPattern[key] = h
			l.hits = append(l.hits, h)
		}
		for _, h := range l.hits {
			if h.nodes > 0 {
				h.desc = templateDescription(h, form)
				h.ldesc = strings.ToLower(h.desc)
			}
		}
	})
	return l.hits
}

func newHit(e *entry, name, kind string, nodes int) *hit {
	desc := e.tool(formSeed)
	h := &hit{e: e, strict: e, name: name, nodes: nodes, kind: kind, title: desc.Title, desc: desc.Description}
	if nodes > 0 && desc.Annotations != nil && desc.Annotations.Title != "" {
		h.title = desc.Annotations.Title // not the one node's "(node …)"
	}
	h.lname = strings.ToLower(name + " " + e.name)
	h.ltitle = strings.ToLower(h.title)
	h.ldesc = strings.ToLower(h.desc)
	return h
}

// templateDescription is a template's description: okso's words for
// the verb, the node count, and how to reach them.
func templateDescription(h *hit, form nameForm) string {
	verb := h.e.name[strings.LastIndexByte(h.e.name, '.')+1:]
	words := h.title + " on"
	if k, ok := schemas.LookupKind(h.kind); ok {
		for _, v := range k.Verbs {
			if v.Name == verb {
				words = verbWords(h.kind, v)
			}
		}
	}
	desc := fmt.Sprintf("%s any of %d nodes of yours: call one by its name (%s with its node id for *), "+
		"or many at once with %s and tool %s. Safety class: %s.",
		words, h.nodes, h.name, nameIn(ToolFleetCall, form), h.name, h.strict.class)
	if h.kind == schemas.KindLocal {
		if n, ok := h.e.invoker.(*nodeTool); ok {
			if cap := n.capability(h.e.name); cap != nil && cap.Description != "" {
				desc += " Each node's operator describes its own; the first node's:" + operatorWords(cap.Description)
			}
		}
		if h.strict.class != h.e.class {
			desc += " Its class differs by node: the strictest is given."
		}
	}
	return desc
}

// nameIn is a canonical name in a form.
func nameIn(name string, form nameForm) string {
	if form == formSafe {
		return schemas.SafeToolName(name)
	}
	return name
}

// score ranks a hit for the words of a query: every word matched
// first, then more words matched, then more in the name, then in the
// title. 0: no word matched.
func (h *hit) score(words []string) int {
	var matched, inName, inTitle int
	for _, w := range words {
		n, t := strings.Contains(h.lname, w), strings.Contains(h.ltitle, w)
		if n || t || strings.Contains(h.ldesc, w) {
			matched++
		}
		if n {
			inName++
		}
		if t {
			inTitle++
		}
	}
	if matched == 0 {
		return 0
	}
	all := 0
	if matched == len(words) {
		all = 1
	}
	return all<<24 | min(matched, 255)<<16 | min(inName, 255)<<8 | min(inTitle, 255)
}

// toolDoc is one tool of okso.find_tools' answer.
type toolDoc struct {
	Name         string               `json:"name"`
	Title        string               `json:"title,omitempty"`
	Description  string               `json:"description,omitempty"`
	InputSchema  any                  `json:"inputSchema"`
	OutputSchema any                  `json:"outputSchema,omitempty"`
	Annotations  *sdk.ToolAnnotations `json:"annotations,omitempty"`
	Source       string               `json:"source"`
	Kind         string               `json:"kind,omitempty"`
	Template     *templateDoc         `json:"template,omitempty"`
}

type templateDoc struct {
	Pattern string `json:"pattern"`
	Nodes   int    `json:"nodes"`
	Via     string `json:"via"`
}

// findDoc is okso.find_tools' answer.
type findDoc struct {
	Tools      []toolDoc `json:"tools"`
	Total      int       `json:"total"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// maxTitle is the longest title find_tools answers (its output schema's
// maxLength).
const maxTitle = 256

// findTools serves okso.find_tools over the caller's view. Its cursor
// is the rank and name of the last hit of the page before, so that a
// page follows it on any replica, even when the tools changed between.
func (f *fleet) findTools(_ context.Context, c *callCtx, raw json.RawMessage) (json.RawMessage, *schemas.Error) {
	var a findArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "arguments do not decode")
	}
	if a.Limit == 0 {
		a.Limit = defaultFindLimit
	}
	afterScore, afterName, ok := decodeFindCursor(a.Cursor)
	if !ok {
		return nil, schemas.NewError(schemas.CodeManifestInvalid, "cursor: pass the next_cursor of the page before")
	}
	// What the caller may call, which includes the per-node tools a
	// lean list leaves out, whatever the token's node_tools.
	v := viewOf(c.claims, f.form, true)
	v.lean = false
	words := strings.Fields(strings.ToLower(a.Query))
	type ranked struct {
		h     *hit
		score int
	}
	var found []ranked
	for _, h := range f.cat.list(v).index(v.form) {
		if a.Source != "" && h.e.origin.source != a.Source || a.Kind != "" && h.kind != a.Kind {
			continue
		}
		s := 0
		if len(words) > 0 {
			if s = h.score(words); s == 0 {
				continue
			}
		}
		found = append(found, ranked{h, s})
	}
	order := func(x ranked, score int, name string) int {
		return cmp.Or(cmp.Compare(score, x.score), strings.Compare(x.h.name, name))
	}
	slices.SortFunc(found, func(x, y ranked) int { return order(x, y.score, y.h.name) })
	start := 0
	if a.Cursor != "" {
		start, _ = slices.BinarySearchFunc(found, afterScore, func(x ranked, _ int) int { return order(x, afterScore, afterName) })
		if start < len(found) && found[start].score == afterScore && found[start].h.name == afterName {
			start++
		}
	}
	end := min(start+a.Limit, len(found))
	doc := findDoc{Tools: make([]toolDoc, 0, end-start), Total: len(found)}
	for _, r := range found[start:end] {
		doc.Tools = append(doc.Tools, r.h.doc(v.form))
	}
	if end < len(found) {
		last := found[end-1]
		doc.NextCursor = encodeFindCursor(last.score, last.h.name)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, schemas.NewError(schemas.CodeInternal, "tools do not encode")
	}
	return out, nil
}

// doc is the hit as find_tools answers it.
func (h *hit) doc(form nameForm) toolDoc {
	t := h.e.tool(form)
	d := toolDoc{Name: t.Name, Title: trimUTF8(h.title, maxTitle), Description: h.desc,
		InputSchema: t.InputSchema, OutputSchema: t.OutputSchema, Source: h.e.origin.source, Kind: h.kind}
	a := t.Annotations
	if h.nodes > 0 && h.strict != h.e {
		a = h.strict.tool(form).Annotations
	}
	if a != nil {
		ann := *a
		ann.Title = trimUTF8(ann.Title, maxTitle)
		d.Annotations = &ann
	}
	if h.e.origin.source != sourceNameDevice {
		d.Kind = ""
	}
	if h.nodes > 0 {
		d.Template = &templateDoc{Pattern: h.name, Nodes: h.nodes, Via: nameIn(ToolFleetCall, form)}
	}
	return d
}

// trimUTF8 cuts s to at most max bytes, at a character's boundary.
func trimUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && s[i]&0xc0 == 0x80 {
		i--
	}
	return s[:i]
}

// encodeFindCursor and decodeFindCursor write and read find_tools'
// cursor: base64url of "<score>:<name>". An empty cursor reads as ok.
func encodeFindCursor(score int, name string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(score) + ":" + name))
}

func decodeFindCursor(cursor string) (score int, name string, ok bool) {
	if cursor == "" {
		return 0, "", true
	}
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return 0, "", false
	}
	s, name, found := strings.Cut(string(raw), ":")
	score, err = strconv.Atoi(s)
	if !found || err != nil || name == "" {
		return 0, "", false
	}
	return score, name, true
}
