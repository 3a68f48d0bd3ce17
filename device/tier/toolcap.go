package tier

import (
	"context"
	"encoding/json"
	"hash/maphash"
	"sync"
	"time"

	"github.com/okso-io/okso/bus"
)

// DefaultMaxToolsPerTenant is the tools a tenant's nodes may register in
// all, on every tier, unless Options say otherwise.
const DefaultMaxToolsPerTenant = 100000

// toolCounts counts each tenant's projected tools on every tier, so that
// an announce can be refused when it would take its tenant over the cap.
// The registry's records are the truth (a watch of them feeds apply); an
// announce admitted here counts from admission until its record shows in
// the watch or its session ends, so announces made at once on one tier
// cannot together pass the cap. Tiers learn of each other's admissions
// only through the registry, a few milliseconds later: announces made at
// the same moment on several tiers may take a tenant over the cap by
// their tools, never refuse one below it. It is safe for concurrent use.
type toolCounts struct {
	seed  maphash.Seed
	ready chan struct{} // closed once the watch has loaded the registry

	mu        sync.Mutex
	readyDone bool
	gen       uint64                  // of the current watch: records not seen again by ready are gone
	nodes     map[string]nodeTools    // by node id, as the registry has them
	pending   map[string]pendingTools // by node id: admitted here, not yet in the registry
	tenants   map[string]int          // tools by tenant, each node counted once
}

type nodeTools struct {
	tenant string
	tools  int
	sum    uint64 // of the record as stored: an unchanged record is not decoded again
	gen    uint64
}

type pendingTools struct {
	session string
	tenant  string
	tools   int
}

func newToolCounts() *toolCounts {
	return &toolCounts{seed: maphash.MakeSeed(), ready: make(chan struct{}),
		nodes: map[string]nodeTools{}, pending: map[string]pendingTools{}, tenants: map[string]int{}}
}

// counted returns what node adds to its tenant's count: its pending
// admission if it has one (about to replace its record), else its record.
// c.mu is held.
func (c *toolCounts) counted(node string) (tenant string, tools int) {
	if p, ok := c.pending[node]; ok {
		return p.tenant, p.tools
	}
	n := c.nodes[node]
	return n.tenant, n.tools
}

// change runs edit, which changes what node counts, and moves the
// tenants' counts accordingly. c.mu is held.
func (c *toolCounts) change(node string, edit func()) {
	t0, n0 := c.counted(node)
	edit()
	t1, n1 := c.counted(node)
	if n0 != 0 {
		if c.tenants[t0] -= n0; c.tenants[t0] <= 0 {
			delete(c.tenants, t0)
		}
	}
	if n1 != 0 {
		c.tenants[t1] += n1
	}
}

// admit counts tools for a session of node of tenant and reports true,
// unless they would take the tenant over max. The node's own record, if
// it is the tenant's, is about to be replaced and does not count.
func (c *toolCounts) admit(session, node, tenant string, tools, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	have := c.tenants[tenant]
	if t, n := c.counted(node); t == tenant {
		have -= n
	}
	if have+tools > max {
		return false
	}
	c.change(node, func() { c.pending[node] = pendingTools{session: session, tenant: tenant, tools: tools} })
	return true
}

// release forgets a session's admission, if it is still pending.
func (c *toolCounts) release(session, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pending[node]; ok && p.session == session {
		c.change(node, func() { delete(c.pending, node) })
	}
}

// record is what the counts need of a registry record.
type record struct {
	NodeID       string `json:"node_id"`
	Tenant       string `json:"tenant"`
	SessionID    string `json:"session_id"`
	State        string `json:"state"`
	Capabilities []struct {
		Verbs []json.RawMessage `json:"verbs"`
	} `json:"capabilities"`
}

// apply takes one change of the registry: value is a node's record as
// stored, nil when the node went away.
func (c *toolCounts) apply(node string, value []byte) {
	if value == nil {
		c.mu.Lock()
		c.change(node, func() { delete(c.nodes, node) })
		c.mu.Unlock()
		return
	}
	sum := maphash.Bytes(c.seed, value)
	c.mu.Lock()
	if n, ok := c.nodes[node]; ok && n.sum == sum { // a refresh
		n.gen = c.gen
		c.nodes[node] = n
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	var r record
	if err := json.Unmarshal(value, &r); err != nil || r.NodeID != node {
		return // not a record okso wrote
	}
	if r.State == bus.StateOffline { // a node that left holds no tools
		c.mu.Lock()
		c.change(node, func() { delete(c.nodes, node) })
		c.mu.Unlock()
		return
	}
	tools := 0
	for _, cp := range r.Capabilities {
		tools += len(cp.Verbs)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.change(node, func() {
		c.nodes[node] = nodeTools{tenant: r.Tenant, tools: tools, sum: sum, gen: c.gen}
		if p, ok := c.pending[node]; ok && p.session == r.SessionID {
			delete(c.pending, node) // the admission is the record now
		}
	})
}

// resync starts a new watch: records it does not report again before
// loaded are gone.
func (c *toolCounts) resync() {
	c.mu.Lock()
	c.gen++
	c.mu.Unlock()
}

// loaded ends a watch's initial state: records of earlier watches that
// it did not report are dropped, and admissions may rely on the counts.
func (c *toolCounts) loaded() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for node, n := range c.nodes {
		if n.gen != c.gen {
			c.change(node, func() { delete(c.nodes, node) })
		}
	}
	if !c.readyDone {
		c.readyDone = true
		close(c.ready)
	}
}

// watchRecords follows the registry until ctx ends, watching again a
// second after a watch fails: it keeps the tier's tool counts (with a
// cap) and its index of the nodes of each tier (for [bus.TierLease.Sweep]),
// and has a session here write its node's record again when another
// write took its place ([Tier.checkRecord]).
func (t *Tier) watchRecords(ctx context.Context) {
	for {
		if t.tools != nil {
			t.tools.resync()
		}
		err := t.o.Registry.WatchRaw(ctx, func(node string, value []byte, _ bool) {
			if t.tools != nil {
				t.tools.apply(node, value)
			}
			t.orphans.Apply(node, value)
			t.checkRecord(node, value)
		}, func() {
			if t.tools != nil {
				t.tools.loaded()
			}
			t.orphans.Loaded()
		})
		if ctx.Err() != nil {
			return
		}
		t.log.Warn("watch registry", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// checkRecord looks at a change of the record of a node: if a session
// here holds the node and the record is no longer its own online record
// (removed, marked offline by a tier that took this one for dead, or
// written by another session), the session writes it again, or leaves
// with 4409 if a newer session wrote it ([keeper.reassert]). Nothing is
// written while the records are this tier's sessions' own.
func (t *Tier) checkRecord(node string, value []byte) {
	t.mu.Lock()
	s := t.sessions[node]
	t.mu.Unlock()
	if s == nil {
		return
	}
	if value != nil {
		var r record
		if json.Unmarshal(value, &r) == nil && r.NodeID == node && r.SessionID == s.id && r.State != bus.StateOffline {
			return
		}
	}
	s.mu.Lock()
	k := s.keeper
	if k == nil {
		s.recheck = true // keepAlive looks again once the claim is in
	}
	s.mu.Unlock()
	if k == nil || s.closed() {
		return // not claimed yet, or leaving
	}
	t.goFor(s, func() {
		ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
		defer cancel()
		k.reassert(ctx)
	})
}
