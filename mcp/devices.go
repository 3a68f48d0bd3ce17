package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// devices is the device source: it follows the registry (KV
// okso_nodes) and lists a node's capabilities as tools once the node's
// subject answers from here (a probe), and remembers the nodes that left
// while the registry keeps their records. It is safe for concurrent use.
type devices struct {
	watched
	nc   *nats.Conn
	reg  *bus.Registry
	set  *schemas.Set
	docs *toolDocs
	// templates are the verbs' shared parts of the node's tools.
	templates templates
	// kinds is the kind table the gateway projects records with (the
	// built-in kinds, and those registered that it follows); never nil
	// once New returns, though the table may be (the built-ins alone).
	kinds func() *schemas.KindTable
	feed  feed
	log   *slog.Logger
	ended func(nodeID string) // the node's streams end (its session went)

	listMu  sync.Mutex // orders listing and unlisting nodes
	mu      sync.RWMutex
	nodes   map[string]*bus.Node // listed, by node id
	pending map[string]string    // node id -> session id being probed before listing
	// offline: the nodes that left, by node id, while the registry keeps
	// their records; their tools answer E_NODE_OFFLINE to their tenant.
	offline map[string]*bus.Node
	probes  chan struct{} // bounds concurrent probes
	probeWG sync.WaitGroup
	// initialProbes counts the probes of the first registry state: the
	// gateway's Ready waits for them (settle).
	initialProbes sync.WaitGroup
}

func newDevices(nc *nats.Conn, reg *bus.Registry, set *schemas.Set, docs *toolDocs, kinds func() *schemas.KindTable, f feed, log *slog.Logger, ended func(string)) *devices {
	d := &devices{nc: nc, reg: reg, set: set, docs: docs, kinds: kinds, feed: f, log: log, ended: ended,
		nodes: map[string]*bus.Node{}, pending: map[string]string{}, offline: map[string]*bus.Node{},
		probes: make(chan struct{}, 64)}
	d.w = newWatcher("registry", d.watch, d.known, func(id string) { d.gone(id, reasonVanished) })
	return d
}

// settle returns once the probes of the first registry state ended, or
// after settleBound, or when ctx ends (then only after those probes
// ended: they end with ctx).
func (d *devices) settle(ctx context.Context) {
	probed := make(chan struct{})
	d.probeWG.Go(func() { d.initialProbes.Wait(); close(probed) })
	select {
	case <-probed:
	case <-time.After(settleBound):
	case <-ctx.Done():
		<-probed
	}
}

// wait waits for the probes.
func (d *devices) wait() { d.probeWG.Wait() }

// watch runs one watch of the registry.
func (d *devices) watch(ctx context.Context, seen func(string), ready func()) error {
	return d.reg.Watch(ctx, func(ev bus.Event) {
		if ev.Initial {
			seen(ev.NodeID)
		}
		d.apply(ctx, ev)
	}, ready)
}

// known are the nodes the source lists, probes, or knows offline.
func (d *devices) known() []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var ids []string
	for _, m := range []map[string]*bus.Node{d.nodes, d.offline} {
		for id := range m {
			ids = append(ids, id)
		}
	}
	for id := range d.pending {
		ids = append(ids, id)
	}
	return ids
}

// apply folds one registry event into the gateway's view. A new node (or
// a new session of a node) is listed only once a probe shows its cmd
// subject answers from here: in a cluster, a subscription reaches the
// other servers a little after the record does.
func (d *devices) apply(ctx context.Context, ev bus.Event) {
	if ev.Node != nil && ev.Node.Offline() {
		why := reasonDisconnect
		if ev.Expired {
			why = reasonLapsed // its tier's lease: the tier died or lost NATS
		}
		d.left(ev.Node, why)
		return
	}
	d.mu.Lock()
	old := d.nodes[ev.NodeID]
	if ev.Node != nil {
		if old != nil && old.SessionID == ev.Node.SessionID && old.Tenant == ev.Node.Tenant {
			d.mu.Unlock()
			return // a lease refresh: nothing changed
		}
		// Online again, even in the session that was offline (its tier's
		// lease lapsed and came back): what the node left before is past.
		// An offline record that comes while this one is probed is kept
		// (list).
		delete(d.offline, ev.NodeID)
		if d.pending[ev.NodeID] == ev.Node.SessionID {
			d.mu.Unlock()
			return // already being probed
		}
		if !schemas.ValidTenant(ev.Node.Tenant) {
			d.mu.Unlock()
			return
		}
		d.pending[ev.NodeID] = ev.Node.SessionID
		d.mu.Unlock()
		// The record is read-only (bus.Event), and so kept as it came:
		// it is the only copy a listed node costs.
		rec := ev.Node
		d.probeWG.Add(1)
		initial := ev.Initial && !d.w.isSynced() // of the first watch, before becomeReady waits
		if initial {
			d.initialProbes.Add(1)
		}
		go func() {
			defer d.probeWG.Done()
			if initial {
				defer d.initialProbes.Done()
			}
			d.probe(ctx, rec)
		}()
		return
	}
	d.mu.Unlock()
	why := reasonDisconnect
	if ev.Expired {
		why = reasonLapsed
	}
	d.gone(ev.NodeID, why)
}

// gone forgets a node that left the registry, for the reason given.
func (d *devices) gone(nodeID, why string) {
	d.mu.Lock()
	delete(d.pending, nodeID)
	_, wasOffline := d.offline[nodeID]
	delete(d.offline, nodeID)
	d.mu.Unlock()
	d.unlist(nodeID, why)
	if wasOffline {
		d.feed.changed()
	}
}

// left takes a node whose record says it left, or whose tier's lease
// lapsed (why says which): its tools are unlisted, and it is remembered
// as offline for its tenant's calls. A probe of its
// session still running gives up (it is no longer pending).
func (d *devices) left(rec *bus.Node, why string) {
	if !schemas.ValidTenant(rec.Tenant) {
		d.gone(rec.NodeID, why)
		return
	}
	n := *rec
	d.mu.Lock()
	delete(d.pending, n.NodeID)
	d.offline[n.NodeID] = &n
	d.mu.Unlock()
	d.unlist(n.NodeID, why)
	d.feed.changed()
}

// offlineNode returns the node that left whose tool name names, if it is
// of tenant: a call of it answers E_NODE_OFFLINE, not E_TOOL_NOT_FOUND.
// name is a device tool's canonical name or its listed form (the node id
// is its second segment either way); another tenant's node that left is
// not told apart from one never seen.
func (d *devices) offlineNode(tenant, name string) *bus.Node {
	sep := "."
	if !strings.Contains(name, sep) {
		sep = "-"
	}
	parts := strings.SplitN(name, sep, 3)
	if len(parts) != 3 {
		return nil
	}
	d.mu.RLock()
	n := d.offline[parts[1]]
	d.mu.RUnlock()
	if n == nil || n.Tenant != tenant {
		return nil
	}
	tools, err := d.kindTable().Project(n.NodeID, n.Capabilities)
	if err != nil {
		return nil
	}
	for _, t := range tools {
		if t.Name == name || schemas.SafeToolName(t.Name) == name {
			return n
		}
	}
	return nil
}

// isOffline reports whether the source knows the node as one that left
// (and whose record the registry still keeps).
func (d *devices) isOffline(nodeID string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.offline[nodeID] != nil
}

// probe asks the node's subject until it answers, then lists the node;
// it gives up when the record it probes for is superseded or removed.
func (d *devices) probe(ctx context.Context, rec *bus.Node) {
	select {
	case d.probes <- struct{}{}:
		defer func() { <-d.probes }()
	case <-ctx.Done():
		return
	}
	wait := 10 * time.Millisecond
	for {
		msg := &nats.Msg{Subject: bus.NodeCmd(rec.NodeID), Header: nats.Header{bus.HeaderProbe: {"1"}}}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := d.nc.RequestMsgWithContext(pctx, msg)
		cancel()
		if err == nil {
			d.list(rec)
			return
		}
		d.mu.RLock()
		current := d.pending[rec.NodeID] == rec.SessionID
		d.mu.RUnlock()
		if !current {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// kindTable is the kind table the source projects records with now.
func (d *devices) kindTable() *schemas.KindTable { return d.kinds() }

// reproject projects again, with the kind table as it is now, every
// listed node whose record names a kind that is not built in: a tier
// may have learnt a registered kind (and projected a node's announce
// with it) before this gateway did, and a record the gateway refused
// for a kind it did not know yet lists its tools once it knows it.
func (d *devices) reproject() {
	d.listMu.Lock()
	defer d.listMu.Unlock()
	d.mu.RLock()
	var recs []*bus.Node
	for _, rec := range d.nodes {
		if slices.ContainsFunc(rec.Capabilities, func(c schemas.Capability) bool { return !schemas.IsBuiltinKind(c.Kind) }) {
			recs = append(recs, rec)
		}
	}
	d.mu.RUnlock()
	for _, rec := range recs {
		if node := d.project(rec); node != nil {
			d.feed.putNode(node)
		} else {
			d.feed.dropNode(rec.NodeID)
		}
	}
	if len(recs) > 0 {
		d.feed.changed()
	}
}

// nodeKey names a node as the owner of its tools.
func nodeKey(nodeID string) string { return "node/" + nodeID }

// list makes a probed node's tools visible to its tenant, replacing an
// older session's.
func (d *devices) list(rec *bus.Node) {
	d.listMu.Lock()
	defer d.listMu.Unlock()
	d.mu.RLock()
	current := d.pending[rec.NodeID] == rec.SessionID
	old := d.nodes[rec.NodeID]
	d.mu.RUnlock()
	if !current {
		return // superseded, or left, while probing
	}
	node, tools := d.project(rec), 0
	if node != nil {
		d.feed.putNode(node)
		tools = len(node.verbs) // those the catalog kept
	} else {
		d.feed.dropNode(rec.NodeID) // a record refused lists no tool
	}
	if old != nil {
		d.ended(rec.NodeID) // its streams were served by the old session
	}
	// The node counts as listed (HasNode, Wait) only once every server
	// lists its tools (put returns then).
	d.mu.Lock()
	delete(d.pending, rec.NodeID) // still pending until now: a refresh meanwhile starts no probe
	// The node's earlier session that left is forgotten; this session's
	// own offline record, if it came meanwhile (left waits for listMu to
	// unlist it), is kept.
	if o := d.offline[rec.NodeID]; o != nil && o.SessionID != rec.SessionID {
		delete(d.offline, rec.NodeID)
	}
	d.nodes[rec.NodeID] = rec
	d.mu.Unlock()
	d.feed.changed()
	d.log.Debug("node online", "node_id", rec.NodeID, "tenant", rec.Tenant, "tools", tools)
}

// unlist removes a node that left the registry, and ends its streams.
func (d *devices) unlist(nodeID, why string) {
	d.listMu.Lock()
	defer d.listMu.Unlock()
	d.mu.RLock()
	old := d.nodes[nodeID]
	d.mu.RUnlock()
	if old == nil {
		return
	}
	// Unlisted from every server first, then forgotten: as in list, the
	// node's count changes only once the servers agree.
	d.feed.dropNode(nodeID)
	d.mu.Lock()
	delete(d.nodes, nodeID)
	d.mu.Unlock()
	d.feed.changed()
	d.ended(nodeID)
	d.feed.unlisted(sourceNameDevice, why, "node_id", nodeID)
}

// project makes what the catalog holds of one node record: a tool per
// verb of each capability ([schemas.Project], as the tier projected
// them), served on the node's cmd subject; nil for a record Project
// refuses (which no tier writes): it lists no tool at all. A tool is its
// capability's index and its verb's template, shared by every node: its
// entry is made when a call or a list needs it ([nodeTool.entry]), and
// its descriptor when a list needs it ([verbTemplate.describe]), so that
// a node at rest costs neither per tool.
func (d *devices) project(rec *bus.Node) *nodeTool {
	kt := d.kindTable()
	tools, err := kt.Project(rec.NodeID, rec.Capabilities)
	if err != nil {
		d.feed.unlisted(sourceNameDevice, reasonRefused, "node_id", rec.NodeID, "err", err)
		return nil
	}
	n := &nodeTool{nodeID: rec.NodeID, rec: rec,
		from:  origin{source: sourceNameDevice, owner: nodeKey(rec.NodeID), nodeID: rec.NodeID},
		verbs: make([]nodeVerb, 0, len(tools))}
	for _, t := range tools {
		// A cap_id is the record's once (Project), and a record has at
		// most schemas.MaxCapabilities.
		c := slices.IndexFunc(rec.Capabilities, func(c schemas.Capability) bool { return c.CapID == t.Cap.CapID })
		n.verbs = append(n.verbs, nodeVerb{tmpl: d.templates.of(d, kt, t), cap: uint8(c)})
	}
	return n
}

// verbTemplate is what the tools of one verb share on every node (of one
// kind, class and idempotence): its checks and the parts of its
// descriptor that do not name the node. Read-only once made.
type verbTemplate struct {
	kind, short   string // the kind and its kind_short
	verb          schemas.Verb
	class, scope  string
	input, output validator
	in, out       json.RawMessage
	ann           *sdk.ToolAnnotations // shared by every descriptor made: read-only
}

// templates are the verb templates made so far. Safe for concurrent use.
type templates struct {
	mu sync.Mutex
	m  map[templateKey]*verbTemplate
}

type templateKey struct {
	kind, verb, class string
	idempotent        bool
	// major: a registered kind's major version (0 for a built-in kind),
	// whose key in okso_kinds never changes.
	major int
}

// of returns the template of a projected tool's verb, made on first use;
// kt is the table t was projected with. A registered kind's verb checks
// its arguments and results with its registered schemas, compiled
// within the bounds of foreign ones, as an upstream's (DESIGN.md §12).
func (ts *templates) of(d *devices, kt *schemas.KindTable, t schemas.Tool) *verbTemplate {
	k := templateKey{t.Cap.Kind, t.Verb.Name, t.Class, t.Kind.Idempotent || t.Cap.Idempotent, t.Kind.Major}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if tmpl := ts.m[k]; tmpl != nil {
		return tmpl
	}
	v := t.Verb
	tmpl := &verbTemplate{kind: k.kind, short: t.Kind.Short, verb: v, class: k.class, scope: auth.ScopeFor(k.class),
		input: embedded{d.set, v.Input}, output: embedded{d.set, v.Output},
		ann: &sdk.ToolAnnotations{Title: v.Title, ReadOnlyHint: k.class == schemas.SafetyReadOnly, IdempotentHint: k.idempotent}}
	if k.class == schemas.SafetyDestructive {
		yes := true
		tmpl.ann.DestructiveHint = &yes
	} else if k.class != schemas.SafetyReadOnly {
		no := false
		tmpl.ann.DestructiveHint = &no
	}
	switch {
	case t.Kind.Registered():
		// Project found the kind in kt, with every schema of its verbs.
		in, _ := kt.Schema(v.Input)
		out, _ := kt.Schema(v.Output)
		tmpl.input, tmpl.output = foreign{f: in.Foreign}, foreign{f: out.Foreign}
		tmpl.in, tmpl.out = in.Doc, out.Doc
	case v.Stream:
		tmpl.in, tmpl.out = d.docs.get(v.Input), d.docs.get(v.Result)
	default:
		tmpl.in, tmpl.out = d.docs.get(v.Input), d.docs.get(v.Output)
	}
	if ts.m == nil {
		ts.m = map[templateKey]*verbTemplate{}
	}
	ts.m[k] = tmpl
	return tmpl
}

// describe makes the descriptor of a node's tool e, named in form.
func (t *verbTemplate) describe(e *entry, form nameForm) *sdk.Tool {
	rec := e.invoker.(*nodeTool).rec
	st := &sdk.Tool{
		Name:         e.listedName(form),
		Title:        t.verb.Title + " (node " + rec.NodeID + ")",
		Description:  describeDeviceTool(t.kind, t.verb, t.class, rec),
		InputSchema:  t.in,
		OutputSchema: t.out,
		Annotations:  t.ann,
		Meta: sdk.Meta{
			schemas.MetaNodeID:      rec.NodeID,
			schemas.MetaKind:        t.kind,
			schemas.MetaSafetyClass: t.class,
		},
	}
	if form == formSafe && e.safe != e.name {
		st.Meta[schemas.MetaName] = e.name
	}
	if t.kind == schemas.KindLocal {
		if cap := e.invoker.(*nodeTool).capability(e.name); cap != nil {
			st.Description += operatorWords(cap.Description)
		}
	}
	if t.verb.Stream {
		st.Description += " Streams each frame as a progress notification (send a progressToken) " +
			"until cancelled; the result tells how the stream ended."
	}
	return st
}

// nodeTool is one node's tools as the catalog holds them: by node, not
// by name (a device tool's name carries its node id: the catalog finds a
// name's node by parsing it), and without an entry per tool (entry makes
// one when a call or a list needs it). It invokes them on the node's cmd
// subject, where the tier session holding the node answers. Read-only
// once put (put keeps in verbs the tools it did not refuse).
type nodeTool struct {
	nodeID string
	rec    *bus.Node // read-only once stored
	// from is the origin of every entry of the node.
	from origin
	// verbs are the node's tools, in the projection's order.
	verbs []nodeVerb
}

// nodeVerb is one tool of a node: a verb of one of its capabilities.
type nodeVerb struct {
	tmpl *verbTemplate
	cap  uint8 // the capability's index in the node's record
}

// capID is the id of the capability of the node's tool v.
func (n *nodeTool) capID(v nodeVerb) string { return n.rec.Capabilities[v.cap].CapID }

// name is the canonical name of the node's tool v.
func (n *nodeTool) name(v nodeVerb) string {
	return schemas.ToolName{KindShort: v.tmpl.short, NodeID: n.nodeID, CapID: n.capID(v), Verb: v.tmpl.verb.Name}.String()
}

// find returns the node's tool that the parsed name t names.
func (n *nodeTool) find(t schemas.ToolName) (nodeVerb, bool) {
	if t.NodeID != n.nodeID {
		return nodeVerb{}, false
	}
	for _, v := range n.verbs {
		if n.capID(v) == t.CapID && v.tmpl.verb.Name == t.Verb && v.tmpl.short == t.KindShort {
			return v, true
		}
	}
	return nodeVerb{}, false
}

// entry makes the catalog entry of the node's tool v, whose canonical
// name is name.
func (n *nodeTool) entry(v nodeVerb, name string) *entry {
	t := v.tmpl
	e := &entry{
		name:    name,
		safe:    schemas.SafeToolName(name),
		class:   t.class,
		scope:   t.scope,
		input:   t.input,
		output:  t.output, // of each frame, for a stream
		shape:   shapeDocument,
		origin:  &n.from,
		invoker: n,
		lazy:    t,
	}
	if t.verb.Stream {
		e.stream = n
	}
	return e
}

// entries makes the entries of the node's tools; none for a nil node.
func (n *nodeTool) entries() []*entry {
	if n == nil || len(n.verbs) == 0 {
		return nil
	}
	out := make([]*entry, len(n.verbs))
	for i, v := range n.verbs {
		out[i] = n.entry(v, n.name(v))
	}
	return out
}

// hop is where a call of the node's tools goes (its subject is made per
// call rather than kept per node).
func (n *nodeTool) hop() hop { return hop{subject: bus.NodeCmd(n.nodeID), offline: "node is offline"} }

// hop is where a call of the node's tool goes, with its budget: the
// gateway's, but for a local tool whose own timeout (its capability's
// deadline_ms_default, at most 60 s) is longer: then that and a second,
// so that a local tool that takes 20 s to restart a service is not
// reported as a timeout (DESIGN.md §12). The tier gives the device the
// tool's timeout, the smaller of the two.
func (n *nodeTool) hopFor(c *callCtx) hop {
	h := n.hop()
	if cap := n.capability(c.entry.name); cap != nil && cap.Kind == schemas.KindLocal {
		if d := time.Duration(cap.Constraints.DeadlineMsDefault)*time.Millisecond + time.Second; d > c.g.o.Budget {
			h.budget = d
		}
	}
	return h
}

// capability returns the node's capability of its tool named name, or
// nil.
func (n *nodeTool) capability(name string) *schemas.Capability {
	tn, ok := schemas.ParseToolName(name)
	if !ok {
		return nil
	}
	for i := range n.rec.Capabilities {
		if c := &n.rec.Capabilities[i]; c.CapID == tn.CapID {
			return c
		}
	}
	return nil
}

// invoke sends a unary call to the node and checks its result: the
// output schema, and the node it names.
func (n *nodeTool) invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	rep, e := c.request(ctx, args, n.hopFor(c))
	if e != nil {
		return nil, e
	}
	return c.checkDocument(rep.Result, n.nodeID)
}

// open asks the node to start a stream.
func (n *nodeTool) open(ctx context.Context, c *callCtx, args json.RawMessage) (*stream, *schemas.Error, error) {
	return c.openStream(ctx, args, n.nodeID, n.hopFor(c))
}

// ids returns the nodes the source lists.
func (d *devices) ids() map[string]bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	ids := make(map[string]bool, len(d.nodes))
	for id := range d.nodes {
		ids[id] = true
	}
	return ids
}

// has reports whether the source lists the node.
func (d *devices) has(nodeID string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.nodes[nodeID] != nil
}

// DeviceView is a read-only look at a gateway's device source
// ([Gateway.Devices]). It is safe for concurrent use.
type DeviceView struct{ d *devices }

// IDs returns the nodes the gateway lists.
func (v DeviceView) IDs() map[string]bool { return v.d.ids() }

// Listed reports whether the gateway currently lists the node.
func (v DeviceView) Listed(nodeID string) bool { return v.d.has(nodeID) }

// Offline reports whether the gateway knows the node as one that left
// (and whose record the registry still keeps).
func (v DeviceView) Offline(nodeID string) bool { return v.d.isOffline(nodeID) }

// counts returns the number of listed nodes per tenant.
func (d *devices) counts() map[string]int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	counts := map[string]int{}
	for _, n := range d.nodes {
		counts[n.Tenant]++
	}
	return counts
}

// toolDocs are the embedded schemas as the compact JSON documents tools
// carry, each made once and shared by every tool that uses it. Safe for
// concurrent use.
type toolDocs struct {
	set *schemas.Set
	log *slog.Logger
	mu  sync.Mutex
	ids map[string]json.RawMessage // by $id, compact, shared read-only
}

// get returns the document of an embedded schema.
func (t *toolDocs) get(id string) json.RawMessage {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d, ok := t.ids[id]; ok {
		return d
	}
	raw, _ := t.set.Raw(id)
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		t.log.Error("embedded schema does not compact", "id", id, "err", err)
		compact.Reset()
		compact.WriteString(`{"type":"object"}`)
	}
	d := json.RawMessage(compact.Bytes())
	if t.ids == nil {
		t.ids = map[string]json.RawMessage{}
	}
	t.ids[id] = d
	return d
}
