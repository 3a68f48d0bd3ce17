package mcp

import (
	"context"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/bus"
)

// Run follows the registry and keeps every tenant's tools in step with it,
// until ctx ends. After a NATS reconnect it watches afresh and reconciles:
// nodes that went away meanwhile are removed, none is listed twice.
//
// While its NATS connection is down, the gateway's registry is
// unavailable: tools/list and every call answer so (E_INTERNAL) rather
// than with what the gateway last knew, and it logs one line when the
// connection goes and one when it is back.
func (g *Gateway) Run(ctx context.Context) error {
	resync := make(chan struct{}, 1)
	status := g.o.NC.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED)
	defer g.o.NC.RemoveStatusListener(status)
	var links sync.WaitGroup
	defer links.Wait()
	links.Go(func() { g.followLink(ctx, status, resync) })
	defer g.probeWG.Wait()
	var once sync.Once
	for {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- g.watch(wctx, func() { once.Do(g.markReady) }) }()
		var err error
		select {
		case err = <-done:
		case <-resync:
			cancel()
			<-done
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			g.log.Warn("registry watch ended; watching again", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// followLink marks the registry unavailable while NATS is down, logs the
// change each way, and asks for a resync when the link is back.
func (g *Gateway) followLink(ctx context.Context, status <-chan nats.Status, resync chan<- struct{}) {
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
			select {
			case resync <- struct{}{}:
			default:
			}
		}
	}
}

// registryDown reports whether the gateway cannot see the registry.
func (g *Gateway) registryDown() bool { return g.busDown.Load() }

// markReady closes Ready once the nodes of the initial state are probed
// (or after a bound, for nodes whose tier is slow to answer).
func (g *Gateway) markReady() {
	g.synced.Store(true)
	go func() {
		done := make(chan struct{})
		go func() { g.initialProbes.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		close(g.ready)
	}()
}

// watch runs one registry watch; when its initial state is in, nodes the
// gateway knew but the registry no longer has are removed.
func (g *Gateway) watch(ctx context.Context, ready func()) error {
	seen := map[string]bool{}
	return g.o.Registry.Watch(ctx, func(ev bus.Event) {
		if ev.Initial {
			seen[ev.NodeID] = true
		}
		g.apply(ctx, ev)
	}, func() {
		g.mu.RLock()
		var ghosts []string
		for id := range g.nodes {
			if !seen[id] {
				ghosts = append(ghosts, id)
			}
		}
		for id := range g.pending {
			if !seen[id] {
				ghosts = append(ghosts, id)
			}
		}
		g.mu.RUnlock()
		for _, id := range ghosts {
			g.apply(ctx, bus.Event{NodeID: id})
		}
		ready()
	})
}

// apply folds one registry event into the gateway's view. A new node (or
// a new session of a node) is listed only once a probe shows its cmd
// subject answers from here: in a cluster, a subscription reaches the
// other servers a little after the record does.
func (g *Gateway) apply(ctx context.Context, ev bus.Event) {
	g.mu.Lock()
	old := g.nodes[ev.NodeID]
	if ev.Node != nil {
		if old != nil && old.rec.SessionID == ev.Node.SessionID && old.rec.Tenant == ev.Node.Tenant {
			g.mu.Unlock()
			return // a lease refresh: nothing changed
		}
		if g.pending[ev.NodeID] == ev.Node.SessionID {
			g.mu.Unlock()
			return // already being probed
		}
		if !bus.ValidTenant(ev.Node.Tenant) {
			g.mu.Unlock()
			return
		}
		g.pending[ev.NodeID] = ev.Node.SessionID
		g.mu.Unlock()
		rec := *ev.Node
		g.probeWG.Add(1)
		initial := ev.Initial && !g.synced.Load() // of the first watch, before markReady waits
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
	delete(g.pending, ev.NodeID)
	g.mu.Unlock()
	g.unlist(ev.NodeID)
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

// list makes a probed node's tools visible to its tenant, replacing an
// older session's.
func (g *Gateway) list(rec *bus.Node) {
	g.sdkMu.Lock()
	defer g.sdkMu.Unlock()
	g.mu.Lock()
	if g.pending[rec.NodeID] != rec.SessionID {
		g.mu.Unlock()
		return // superseded while probing
	}
	old := g.nodes[rec.NodeID]
	n := g.project(rec)
	views := g.viewsOfLocked(rec.Tenant)
	g.mu.Unlock()
	if old != nil {
		g.removeTools(old)
		g.nodeGone(rec.NodeID) // its streams were served by the old session
	}
	for v, srv := range views {
		for _, t := range n.tools {
			if v.allows(t.scope) {
				srv.AddTool(t.schema, unreachable)
			}
		}
	}
	// The node counts as listed (HasNode, Wait) only once every server
	// lists its tools: no view is made meanwhile (sdkMu is held), and one
	// made later takes the tools from g.nodes.
	g.mu.Lock()
	delete(g.pending, rec.NodeID) // still pending until now: a refresh meanwhile starts no probe
	g.nodes[rec.NodeID] = n
	g.mu.Unlock()
	g.changed()
	g.log.Debug("node online", "node_id", rec.NodeID, "tenant", rec.Tenant, "tools", len(n.tools))
}

// unlist removes a node that left the registry, and ends its streams.
func (g *Gateway) unlist(nodeID string) {
	g.sdkMu.Lock()
	defer g.sdkMu.Unlock()
	g.mu.Lock()
	old := g.nodes[nodeID]
	g.mu.Unlock()
	if old == nil {
		return
	}
	// Unlisted from every server first, then forgotten: as in list, the
	// node's count changes only once the servers agree.
	g.removeTools(old)
	g.mu.Lock()
	if g.nodes[nodeID] == old {
		delete(g.nodes, nodeID)
	}
	g.mu.Unlock()
	g.changed()
	g.nodeGone(nodeID)
	g.log.Debug("node offline", "node_id", nodeID)
}

// removeTools takes a node's tools out of every view of its tenant.
func (g *Gateway) removeTools(n *node) {
	g.mu.RLock()
	views := g.viewsOfLocked(n.rec.Tenant)
	g.mu.RUnlock()
	for v, srv := range views {
		var names []string
		for name, t := range n.tools {
			if v.allows(t.scope) {
				names = append(names, name)
			}
		}
		if len(names) > 0 {
			srv.RemoveTools(names...)
		}
	}
}

// changed wakes the waiters of [Gateway.Wait].
func (g *Gateway) changed() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.changedCh)
	g.changedCh = make(chan struct{})
}

// unreachable is the handler registered with the SDK; [Gateway.intercept]
// answers every tools/call before the SDK would call it.
func unreachable(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
	return nil, errNotIntercepted
}
