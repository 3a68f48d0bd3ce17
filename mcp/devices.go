package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// The device source of the catalog: every gateway watches the registry
// (KV okso_nodes) and lists a node's capabilities as tools once the node's
// subject answers from here.

// Run follows the registries (KV okso_nodes, and okso_remotes and
// okso_callers when Options.Remotes and Options.Callers are set), each
// with its source's watcher, and keeps every tenant's tools in step with
// them, until ctx ends. After a NATS reconnect every watcher watches
// afresh and reconciles: what went away meanwhile is removed, nothing is
// listed twice. Run returns once every goroutine it started has ended.
//
// While its NATS connection is down, the gateway's registry is
// unavailable: tools/list and every call answer so (E_INTERNAL) rather
// than with what the gateway last knew, and it logs one line when the
// connection goes and one when it is back.
func (g *Gateway) Run(ctx context.Context) error {
	status := g.o.NC.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED)
	defer g.o.NC.RemoveStatusListener(status)
	var wg sync.WaitGroup
	wg.Go(func() { g.followLink(ctx, status) })
	for _, w := range g.watchers {
		wg.Go(func() { w.run(ctx, g.log) })
	}
	wg.Go(func() { g.becomeReady(ctx) })
	wg.Wait()
	g.probeWG.Wait() // the watches that started probes have ended: no more start
	return nil
}

// followLink marks the registry unavailable while NATS is down, logs the
// change each way, and asks every watcher for a fresh watch when the
// link is back.
func (g *Gateway) followLink(ctx context.Context, status <-chan nats.Status) {
	if !g.o.NC.IsConnected() {
		g.busDown.Store(true)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-status:
			down := st != nats.CONNECTED
			if g.busDown.Swap(down) == down {
				continue
			}
			if down {
				g.log.Warn("NATS connection lost: tools/list and calls answer E_INTERNAL registry unavailable until it is back")
				continue
			}
			g.log.Info("NATS connection back: reloading the registry")
			for _, w := range g.watchers {
				w.kick()
			}
		}
	}
}

// registryDown reports whether the gateway cannot see the registry.
func (g *Gateway) registryDown() bool { return g.busDown.Load() }

// becomeReady closes Ready once the initial state of the registry is in,
// its nodes are probed (or after a bound, for nodes whose tier is slow
// to answer), and the upstreams and callers of their initial states are
// listed. It returns when ctx ends, if before; then only after the
// probes it waited on ended (they end with ctx).
func (g *Gateway) becomeReady(ctx context.Context) {
	select {
	case <-g.nodesW.synced:
	case <-ctx.Done():
		return
	}
	probed := make(chan struct{})
	go func() { g.initialProbes.Wait(); close(probed) }()
	defer func() { <-probed }()
	select {
	case <-probed:
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
		return
	}
	for _, w := range g.watchers {
		select {
		case <-w.synced:
		case <-ctx.Done():
			return
		}
	}
	close(g.ready)
}

// watchNodes runs one watch of the registry.
func (g *Gateway) watchNodes(ctx context.Context, seen func(string), ready func()) error {
	return g.o.Registry.Watch(ctx, func(ev bus.Event) {
		if ev.Initial {
			seen(ev.NodeID)
		}
		g.apply(ctx, ev)
	}, ready)
}

// knownNodes are the nodes the gateway lists, probes, or knows offline.
func (g *Gateway) knownNodes() []string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	var ids []string
	for _, m := range []map[string]*bus.Node{g.nodes, g.offline} {
		for id := range m {
			ids = append(ids, id)
		}
	}
	for id := range g.pending {
		ids = append(ids, id)
	}
	return ids
}

// apply folds one registry event into the gateway's view. A new node (or
// a new session of a node) is listed only once a probe shows its cmd
// subject answers from here: in a cluster, a subscription reaches the
// other servers a little after the record does.
func (g *Gateway) apply(ctx context.Context, ev bus.Event) {
	if ev.Node != nil && ev.Node.Offline() {
		g.left(ev.Node)
		return
	}
	g.mu.Lock()
	old := g.nodes[ev.NodeID]
	if ev.Node != nil {
		if old != nil && old.SessionID == ev.Node.SessionID && old.Tenant == ev.Node.Tenant {
			g.mu.Unlock()
			return // a lease refresh: nothing changed
		}
		if g.pending[ev.NodeID] == ev.Node.SessionID {
			g.mu.Unlock()
			return // already being probed
		}
		if !schemas.ValidTenant(ev.Node.Tenant) {
			g.mu.Unlock()
			return
		}
		g.pending[ev.NodeID] = ev.Node.SessionID
		g.mu.Unlock()
		rec := *ev.Node
		g.probeWG.Add(1)
		initial := ev.Initial && !g.nodesW.isSynced() // of the first watch, before becomeReady waits
		if initial {
			g.initialProbes.Add(1)
		}
		go func() {
			defer g.probeWG.Done()
			if initial {
				defer g.initialProbes.Done()
			}
			g.probe(ctx, &rec)
		}()
		return
	}
	g.mu.Unlock()
	why := reasonDisconnect
	if ev.Expired {
		why = reasonLapsed
	}
	g.gone(ev.NodeID, why)
}

// gone forgets a node that left the registry, for the reason given.
func (g *Gateway) gone(nodeID, why string) {
	g.mu.Lock()
	delete(g.pending, nodeID)
	_, wasOffline := g.offline[nodeID]
	delete(g.offline, nodeID)
	g.mu.Unlock()
	g.unlist(nodeID, why)
	if wasOffline {
		g.changed()
	}
}

// left takes a node whose record says it left: its tools are unlisted,
// and it is remembered as offline for its tenant's calls. A probe of its
// session still running gives up (it is no longer pending).
func (g *Gateway) left(rec *bus.Node) {
	if !schemas.ValidTenant(rec.Tenant) {
		g.gone(rec.NodeID, reasonDisconnect)
		return
	}
	n := *rec
	g.mu.Lock()
	delete(g.pending, n.NodeID)
	g.offline[n.NodeID] = &n
	g.mu.Unlock()
	g.unlist(n.NodeID, reasonDisconnect)
	g.changed()
}

// offlineNode returns the node that left whose tool name names, if it is
// of tenant: a call of it answers E_NODE_OFFLINE, not E_TOOL_NOT_FOUND.
// name is a device tool's canonical name or its listed form (the node id
// is its second segment either way); another tenant's node that left is
// not told apart from one never seen.
func (g *Gateway) offlineNode(tenant, name string) *bus.Node {
	sep := "."
	if !strings.Contains(name, sep) {
		sep = "-"
	}
	parts := strings.SplitN(name, sep, 3)
	if len(parts) != 3 {
		return nil
	}
	g.mu.RLock()
	n := g.offline[parts[1]]
	g.mu.RUnlock()
	if n == nil || n.Tenant != tenant {
		return nil
	}
	tools, err := schemas.Project(n.NodeID, n.Capabilities)
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

// NodeOffline reports whether the gateway knows the node as one that
// left (and whose record the registry still keeps).
func (g *Gateway) NodeOffline(nodeID string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.offline[nodeID] != nil
}

// probe asks the node's subject until it answers, then lists the node;
// it gives up when the record it probes for is superseded or removed.
func (g *Gateway) probe(ctx context.Context, rec *bus.Node) {
	select {
	case g.probes <- struct{}{}:
		defer func() { <-g.probes }()
	case <-ctx.Done():
		return
	}
	wait := 10 * time.Millisecond
	for {
		msg := &nats.Msg{Subject: bus.NodeCmd(rec.NodeID), Header: nats.Header{bus.HeaderProbe: {"1"}}}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := g.o.NC.RequestMsgWithContext(pctx, msg)
		cancel()
		if err == nil {
			g.list(rec)
			return
		}
		g.mu.RLock()
		current := g.pending[rec.NodeID] == rec.SessionID
		g.mu.RUnlock()
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

// nodeKey is the catalog key of a node's tools.
func nodeKey(nodeID string) string { return "node/" + nodeID }

// list makes a probed node's tools visible to its tenant, replacing an
// older session's.
func (g *Gateway) list(rec *bus.Node) {
	g.listMu.Lock()
	defer g.listMu.Unlock()
	g.mu.RLock()
	current := g.pending[rec.NodeID] == rec.SessionID
	old := g.nodes[rec.NodeID]
	g.mu.RUnlock()
	if !current {
		return // superseded, or left, while probing
	}
	entries := g.project(rec)
	g.cat.put(nodeKey(rec.NodeID), rec.Tenant, entries)
	if old != nil {
		g.nodeGone(rec.NodeID) // its streams were served by the old session
	}
	// The node counts as listed (HasNode, Wait) only once every server
	// lists its tools (put returns then).
	g.mu.Lock()
	delete(g.pending, rec.NodeID) // still pending until now: a refresh meanwhile starts no probe
	// The node's earlier session that left is forgotten; this session's
	// own offline record, if it came meanwhile (left waits for listMu to
	// unlist it), is kept.
	if o := g.offline[rec.NodeID]; o != nil && o.SessionID != rec.SessionID {
		delete(g.offline, rec.NodeID)
	}
	listed := *rec
	g.nodes[rec.NodeID] = &listed
	g.mu.Unlock()
	g.changed()
	g.log.Debug("node online", "node_id", rec.NodeID, "tenant", rec.Tenant, "tools", len(entries))
}

// unlist removes a node that left the registry, and ends its streams.
func (g *Gateway) unlist(nodeID, why string) {
	g.listMu.Lock()
	defer g.listMu.Unlock()
	g.mu.RLock()
	old := g.nodes[nodeID]
	g.mu.RUnlock()
	if old == nil {
		return
	}
	// Unlisted from every server first, then forgotten: as in list, the
	// node's count changes only once the servers agree.
	g.cat.drop(nodeKey(nodeID))
	g.mu.Lock()
	delete(g.nodes, nodeID)
	g.mu.Unlock()
	g.changed()
	g.nodeGone(nodeID)
	g.unlisted(sourceNameDevice, why, "node_id", nodeID)
}

// changed wakes the waiters of [Gateway.Wait].
func (g *Gateway) changed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.changedCh)
	g.changedCh = make(chan struct{})
}

// project builds the catalog entries of one node record: a tool per verb
// of each capability ([schemas.Project], as the tier projected them),
// served on the node's cmd subject. A record Project refuses (which no
// tier writes) lists no tool at all.
func (g *Gateway) project(rec *bus.Node) []*entry {
	tools, err := schemas.Project(rec.NodeID, rec.Capabilities)
	if err != nil {
		g.unlisted(sourceNameDevice, reasonRefused, "node_id", rec.NodeID, "err", err)
		return nil
	}
	entries := make([]*entry, 0, len(tools))
	node := &nodeTool{nodeID: rec.NodeID, subject: bus.NodeCmd(rec.NodeID)}
	for _, t := range tools {
		c, v, class := t.Cap, t.Verb, t.Class
		st := &sdk.Tool{
			Name:        t.Name,
			Title:       fmt.Sprintf("%s (node %s)", v.Title, rec.NodeID),
			Description: describeDeviceTool(c.Kind, v, class, rec),
			InputSchema: g.toolDoc(v.Input),
			Annotations: &sdk.ToolAnnotations{
				Title:          v.Title,
				ReadOnlyHint:   class == schemas.SafetyReadOnly,
				IdempotentHint: t.Kind.Idempotent || c.Idempotent,
			},
			Meta: sdk.Meta{
				schemas.MetaNodeID:      rec.NodeID,
				schemas.MetaKind:        c.Kind,
				schemas.MetaSafetyClass: class,
			},
		}
		if class == schemas.SafetyDestructive {
			yes := true
			st.Annotations.DestructiveHint = &yes
		} else if class != schemas.SafetyReadOnly {
			no := false
			st.Annotations.DestructiveHint = &no
		}
		if v.Stream {
			st.OutputSchema = g.toolDoc(v.Result)
			st.Description += " Streams each frame as a progress notification (send a progressToken) " +
				"until cancelled; the result tells how the stream ended."
		} else {
			st.OutputSchema = g.toolDoc(v.Output)
		}
		e := &entry{
			name:    t.Name,
			class:   class,
			scope:   auth.ScopeFor(class),
			input:   embedded{g.o.Schemas, v.Input},
			output:  embedded{g.o.Schemas, v.Output}, // of each frame, for a stream
			shape:   shapeDocument,
			origin:  origin{source: sourceNameDevice, owner: nodeKey(rec.NodeID), nodeID: rec.NodeID},
			invoker: node,
			desc:    st,
		}
		if v.Stream {
			e.stream = node
		}
		entries = append(entries, e)
	}
	return entries
}

// nodeTool invokes the tools of one node: on the node's cmd subject,
// where the tier session holding the node answers.
type nodeTool struct{ nodeID, subject string }

func (n *nodeTool) hop() hop { return hop{subject: n.subject, offline: "node is offline"} }

// invoke sends a unary call to the node and checks its result: the
// output schema, and the node it names.
func (n *nodeTool) invoke(ctx context.Context, c *callCtx, args json.RawMessage) (json.RawMessage, *schemas.Error) {
	rep, e := c.request(ctx, args, n.hop())
	if e != nil {
		return nil, e
	}
	return c.checkDocument(rep.Result, n.nodeID)
}

// open asks the node to start a stream.
func (n *nodeTool) open(ctx context.Context, c *callCtx, args json.RawMessage) (*stream, *schemas.Error, error) {
	return c.openStream(ctx, args, n.nodeID, n.hop())
}

// NodeIDs returns the nodes the gateway lists.
func (g *Gateway) NodeIDs() map[string]bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	ids := make(map[string]bool, len(g.nodes))
	for id := range g.nodes {
		ids[id] = true
	}
	return ids
}

// HasNode reports whether the gateway currently lists the node.
func (g *Gateway) HasNode(nodeID string) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.nodes[nodeID] != nil
}
