package bus

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Event is one change of a node's presence seen by [Registry.Watch].
type Event struct {
	NodeID string
	// Node is the node's record with its effective state (nil when the
	// record went away). Its slices and maps may be shared with other
	// events' records: they are read-only.
	Node    *Node
	Initial bool // part of the initial state
	// Expired: the node went away, or offline, because a lease ran out:
	// its own (an older tier's record that its tier stopped refreshing),
	// or its tier's.
	Expired bool
}

// Watch calls fn for every node record present, then calls ready once,
// then calls fn for every change, until ctx is done. It returns ctx's
// error, or the watch's if it fails. fn and ready run on Watch's
// goroutine.
//
// Each record comes with its effective state: one written under a
// tier's lease ([TierLease.Claim]) is online only while that lease is
// alive. When the lease lapses (the tier died) or is released, each of
// its online nodes comes again, offline, with LastSeen the tier's last
// heartbeat; when it is alive again, they come again online. Nothing
// reaches fn on a tier's heartbeat, so a watch's work while a fleet is
// idle grows with its tiers, not its nodes.
func (r *Registry) Watch(ctx context.Context, fn func(Event), ready func()) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	changes := make(chan presenceChange)
	errc := make(chan error, 2)
	send := func(c presenceChange) {
		select {
		case changes <- c:
		case <-ctx.Done():
		}
	}
	run := func(bucket string, decode func(kvChange) presenceChange) {
		wg.Go(func() {
			err := follow(ctx, r.js.Conn(), bucket, "", func(c kvChange) { send(decode(c)) },
				func() { send(presenceChange{bucket: bucket, ready: true}) })
			errc <- err
		})
	}
	p := &presence{r: r, fn: fn, tiers: map[string]tierState{}, nodes: map[string]*Node{}, byTier: map[string]map[string]bool{}}
	// The tiers first: the nodes' initial state is judged by theirs.
	run(BucketTiers, func(c kvChange) presenceChange {
		return presenceChange{bucket: BucketTiers, c: kvChange{key: c.key, seq: c.seq, at: c.at,
			value: bytes.Clone(c.value), expired: c.expired, initial: c.initial}}
	})
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		case c := <-changes:
			switch {
			case c.bucket == BucketTiers && c.ready:
				run(BucketNodes, decodeNode)
			case c.bucket == BucketTiers:
				p.tier(ctx, c.c)
			case c.ready:
				if ready != nil {
					ready()
				}
			case c.skip:
			default:
				p.node(ctx, c.c.key, c.node, c.c.initial, c.c.expired)
			}
		}
	}
}

// presenceChange is a change one of Watch's followers saw.
type presenceChange struct {
	bucket string
	ready  bool // the follower's initial state is in
	c      kvChange
	node   *Node // of a record, decoded
	skip   bool  // a record okso did not write
}

// decodeNode decodes a change of okso_nodes, on its follower's goroutine.
func decodeNode(c kvChange) presenceChange {
	pc := presenceChange{bucket: BucketNodes, c: kvChange{key: c.key, initial: c.initial, expired: c.expired}}
	if c.value != nil {
		n, err := decodeRecord(c.value)
		if err != nil || n.NodeID != c.key {
			pc.skip = true // not a record okso wrote; ignore it
			return pc
		}
		pc.node = n
	}
	return pc
}

// presence merges the nodes' records and the tiers' leases.
type presence struct {
	r     *Registry
	fn    func(Event)
	tiers map[string]tierState
	// nodes are the records under a tier's lease that say online, by
	// node id, and byTier their ids by tier: those a tier's lease
	// decides.
	nodes  map[string]*Node
	byTier map[string]map[string]bool
}

// tierState is what a watch knows of a tier's lease.
type tierState struct {
	seq   uint64
	alive bool
	beat  time.Time // its last heartbeat seen (zero: none)
	gone  time.Time // when it was seen to lapse (zero: unknown)
}

// lastSeen is when a node of a dead tier was last known online.
func (t tierState) lastSeen(n *Node) time.Time {
	switch {
	case !t.beat.IsZero():
		return t.beat.UTC()
	case !t.gone.IsZero():
		return t.gone.UTC()
	}
	return n.ConnectedAt
}

// effective is n as it stands: offline if its tier's lease is not alive.
func (p *presence) effective(n *Node) *Node {
	if !n.TierLease || n.Offline() {
		return n
	}
	t := p.tiers[n.Tier]
	if t.alive {
		return n
	}
	off := *n
	off.State, off.LastSeen = StateOffline, t.lastSeen(n)
	return &off
}

// node applies a change of a node's record.
func (p *presence) node(ctx context.Context, id string, n *Node, initial, expired bool) {
	if old := p.nodes[id]; old != nil {
		delete(p.nodes, id)
		delete(p.byTier[old.Tier], id)
		p.forget(old.Tier)
	}
	if n == nil {
		p.fn(Event{NodeID: id, Initial: initial, Expired: expired})
		return
	}
	if n.TierLease && !n.Offline() {
		if _, known := p.tiers[n.Tier]; !known {
			p.learn(ctx, n.Tier)
		}
		p.nodes[id] = n
		if p.byTier[n.Tier] == nil {
			p.byTier[n.Tier] = map[string]bool{}
		}
		p.byTier[n.Tier][id] = true
	}
	p.fn(Event{NodeID: id, Node: p.effective(n), Initial: initial})
}

// learn reads the lease of a tier the watch has not seen: a record can
// come before its tier's heartbeat, which the tier wrote first, for the
// two buckets are followed apart.
func (p *presence) learn(ctx context.Context, tier string) {
	t := tierState{}
	e, err := p.r.tiers.Get(ctx, tier)
	switch {
	case err == nil:
		t = tierState{seq: e.Revision(), alive: true, beat: e.Created()}
	case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
	default:
		// Unknown: taken as alive (the tier was when it wrote the record)
		// until its lease's next message says otherwise.
		t.alive = true
	}
	p.tiers[tier] = t
}

// forget drops what is known of a dead tier none of whose nodes is left.
func (p *presence) forget(tier string) {
	if len(p.byTier[tier]) == 0 {
		delete(p.byTier, tier)
		if !p.tiers[tier].alive {
			delete(p.tiers, tier)
		}
	}
}

// tier applies a change of a tier's lease: a heartbeat of a live tier
// changes nothing else; a lease that lapses, or comes back, changes its
// nodes.
func (p *presence) tier(_ context.Context, c kvChange) {
	old, known := p.tiers[c.key]
	if known && c.seq != 0 && c.seq <= old.seq {
		return // older than what the watch knows (read by learn)
	}
	t := tierState{seq: c.seq, alive: c.value != nil, beat: old.beat, gone: old.gone}
	if t.alive {
		t.beat, t.gone = c.at, time.Time{}
	} else {
		t.gone = c.at
	}
	p.tiers[c.key] = t
	if known && old.alive == t.alive {
		return
	}
	for id := range p.byTier[c.key] {
		n := p.nodes[id]
		p.fn(Event{NodeID: id, Node: p.effective(n), Expired: !t.alive && c.expired})
	}
	if !t.alive && !c.initial {
		p.forget(c.key) // kept while the nodes' initial state comes in
	}
}
