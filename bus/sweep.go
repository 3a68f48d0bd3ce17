package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A node's record under a tier's lease says online until something
// writes it again. When its tier dies, every reader takes it offline at
// once ([Registry.Watch]); the record itself is then marked offline, to
// expire after the offline retention like any node's that left, by one
// of the live tiers: the one that ranks highest for the dead tier
// (rendezvous hashing), so that a hundred tiers do not all try. The
// write is checked against the record read, so it never overwrites a
// newer session's; and it happens once, for an offline record is not
// swept again. The sweeper gives the node's binding its TTL first, as
// the session would have at its end, checked against the revision the
// record says its session wrote: a node bound since by a session on
// another tier keeps its binding without one.
//
// A tier that starts sweeps the records of tiers that died before it
// (every tier may have been killed at once): their nodes' bindings get
// their TTL then. Until some tier runs, they have none — but without a
// tier no device connects, so no tenant is kept from a node id by it.

// Orphans indexes the online records under tiers' leases by tier, kept
// from a watch of the registry ([Registry.WatchRaw], which a tier runs
// anyway) by Apply and Loaded: [TierLease.Sweep] finds a dead tier's
// nodes in it without reading every record. The zero value is not
// ready: use [NewOrphans]. It is safe for concurrent use.
type Orphans struct {
	mu     sync.Mutex
	names  map[string]string          // each tier's id, held once
	tierOf map[string]string          // by node id
	byTier map[string]map[string]bool // node ids, by tier
	loaded chan struct{}
	once   sync.Once
}

// NewOrphans returns an empty index.
func NewOrphans() *Orphans {
	return &Orphans{names: map[string]string{}, tierOf: map[string]string{}, byTier: map[string]map[string]bool{},
		loaded: make(chan struct{})}
}

// Apply takes one change of a node's record: its value as stored, nil
// when it went away.
func (o *Orphans) Apply(nodeID string, value []byte) {
	var r struct {
		NodeID    string `json:"node_id"`
		Tier      string `json:"tier"`
		State     string `json:"state"`
		TierLease bool   `json:"tier_lease"`
	}
	online := value != nil && json.Unmarshal(value, &r) == nil && r.NodeID == nodeID && r.TierLease && r.State != StateOffline
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, ok := o.tierOf[nodeID]; ok && (!online || old != r.Tier) {
		delete(o.tierOf, nodeID)
		delete(o.byTier[old], nodeID)
		if len(o.byTier[old]) == 0 {
			delete(o.byTier, old)
			delete(o.names, old)
		}
	}
	if online {
		// One copy of the tier's id for all its nodes, not one per record.
		if name, ok := o.names[r.Tier]; ok {
			r.Tier = name
		} else {
			o.names[r.Tier] = r.Tier
		}
		o.tierOf[nodeID] = r.Tier
		if o.byTier[r.Tier] == nil {
			o.byTier[r.Tier] = map[string]bool{}
		}
		o.byTier[r.Tier][nodeID] = true
	}
}

// Loaded says the watch's initial state is in (of its first watch: a
// later one only adds to what is known).
func (o *Orphans) Loaded() { o.once.Do(func() { close(o.loaded) }) }

// of returns the node ids of the given tiers' online records, by tier.
func (o *Orphans) of(pick func(tier string) bool) map[string][]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]string{}
	for tier, nodes := range o.byTier {
		if !pick(tier) {
			continue
		}
		for id := range nodes {
			out[tier] = append(out[tier], id)
		}
	}
	return out
}

// Sweep marks offline the records of nodes whose tier's lease is gone,
// found in idx, and gives their bindings in b (nil: none kept) their
// TTL, until ctx ends: once idx is loaded (records a tier left
// when it died, perhaps long ago), and whenever a tier's lease lapses or
// is released. It sweeps those whose tier this lease's ranks highest
// for among the live tiers it knows. A failed pass is tried again, a
// little later each time. It returns ctx's error, or its watch's if that
// fails.
func (l *TierLease) Sweep(ctx context.Context, idx *Orphans, b *Bindings, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type change struct {
		key   string
		alive bool
		at    time.Time
		ttl   time.Duration // the lease's, as its holder says (0: unknown)
		ready bool
	}
	changes := make(chan change)
	errc := make(chan error, 1)
	send := func(c change) {
		select {
		case changes <- c:
		case <-ctx.Done():
		}
	}
	go func() {
		errc <- follow(ctx, l.r.js.Conn(), BucketTiers, "", func(c kvChange) {
			ch := change{key: c.key, alive: c.value != nil, at: c.at}
			var b tierBeat
			if c.value != nil && json.Unmarshal(c.value, &b) == nil && b.TTLMs > 0 {
				ch.ttl = time.Duration(b.TTLMs) * time.Millisecond
			}
			send(ch)
		}, func() { send(change{ready: true}) })
	}()
	tiers := map[string]tierState{}
	ttls := map[string]time.Duration{}  // each tier's lease TTL, as it says
	deadSince := map[string]time.Time{} // when a pass first found a tier's lease gone
	var (
		followed, due bool
		loaded        = idx.loaded
		pass          <-chan time.Time // the next pass, when one is put off
		backoff       = time.Second
	)
	for {
		select {
		case <-ctx.Done():
			<-errc
			return ctx.Err()
		case err := <-errc:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		case <-loaded:
			loaded, due = nil, true
		case c := <-changes:
			switch {
			case c.ready:
				followed, due = true, true
			case c.alive:
				tiers[c.key] = tierState{alive: true, beat: c.at}
				if c.ttl > 0 {
					ttls[c.key] = c.ttl
				}
			default:
				t := tiers[c.key]
				due = due || t.alive // a lease that lapsed, or was released
				tiers[c.key] = tierState{beat: t.beat, gone: c.at}
			}
		case <-pass:
			pass, due = nil, true
		}
		if !due || !followed || loaded != nil || pass != nil {
			continue
		}
		due = false
		grace := func(tier string) time.Duration {
			if d, ok := ttls[tier]; ok {
				return d
			}
			return l.r.ttl
		}
		n, wait, err := l.sweep(ctx, idx, b, tiers, deadSince, grace)
		if n > 0 {
			log.Info("marked offline the nodes of tiers whose lease is gone", "nodes", n)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("mark offline the nodes of tiers whose lease is gone", "err", err, "again_in", backoff)
			pass = time.After(backoff)
			backoff = min(2*backoff, l.r.ttl)
		case wait > 0:
			pass = time.After(wait)
		default:
			backoff = time.Second
		}
	}
}

// sweep is one pass: it marks offline the online records of the tiers
// whose lease is gone that are this tier's to sweep. It returns how many
// it marked.
//
// A tier whose lease a pass finds gone is given its TTL (grace) to take
// it again, counted from then: its nodes are marked offline only by a
// pass at least that much later that finds it gone still. So a tier
// whose lease lapsed only because NATS was away from every tier at once
// is not swept (it takes its lease again within a third of its TTL of
// NATS coming back); wait is when the next pass is due for such tiers
// (0: none).
func (l *TierLease) sweep(ctx context.Context, idx *Orphans, b *Bindings, tiers map[string]tierState,
	deadSince map[string]time.Time, grace func(string) time.Duration) (swept int, wait time.Duration, _ error) {
	var live []string
	for id, t := range tiers {
		if t.alive {
			live = append(live, id)
		}
	}
	if !tiers[l.id].alive {
		live = append(live, l.id) // its own heartbeat may not have come round yet
	}
	orphans := idx.of(func(tier string) bool { return !tiers[tier].alive && sweeper(tier, live) == l.id })
	var errs []error
	for tier := range deadSince {
		if _, ok := orphans[tier]; !ok {
			delete(deadSince, tier) // swept, or taken by another, or alive
		}
	}
	for tier, nodes := range orphans {
		// The tier may have started after the follower read the leases
		// (it wrote its lease before its records), or taken its lease
		// again: ask.
		_, err := l.r.tiers.Get(ctx, tier)
		if err == nil {
			delete(deadSince, tier)
			continue
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
			errs = append(errs, err)
			continue
		}
		now := time.Now()
		since, ok := deadSince[tier]
		if !ok {
			since, deadSince[tier] = now, now
		}
		if left := since.Add(grace(tier)).Sub(now); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		for _, id := range nodes {
			ok, err := l.markOffline(ctx, id, tier, tiers[tier], b)
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				swept++
			}
		}
	}
	return swept, wait, errors.Join(errs...)
}

// markOffline marks the record of node id offline if it is still an
// online record under the lease of tier, as of t's last heartbeat, and
// first gives the binding its session wrote its TTL (in b, when not nil).
func (l *TierLease) markOffline(ctx context.Context, id, tier string, t tierState, b *Bindings) (bool, error) {
	now, err := readState(ctx, l.r.js.Conn(), BucketNodes, id)
	if err != nil {
		return false, err
	}
	e := now[id]
	var n Node
	if e.value == nil || json.Unmarshal(e.value, &n) != nil || n.NodeID != id || !n.TierLease || n.Offline() || n.Tier != tier {
		return false, nil // no longer the dead tier's
	}
	if b != nil && n.BindingRev != 0 {
		// Before the record: an offline record is not swept again, so a
		// binding left for after it would keep no TTL if this failed.
		if err := b.Release(ctx, id, n.Tenant, n.BindingRev); err != nil {
			return false, err
		}
	}
	n.State, n.LastSeen = StateOffline, t.lastSeen(&n)
	data, err := json.Marshal(n)
	if err != nil {
		return false, err
	}
	_, err = l.r.js.Publish(ctx, "$KV."+BucketNodes+"."+id, data,
		jetstream.WithMsgTTL(l.r.retention), jetstream.WithExpectLastSequencePerSubject(e.seq))
	switch {
	case err == nil:
		return true, nil
	case wrongSequence(err): // written meanwhile: its writer's
		return false, nil
	}
	return false, fmt.Errorf("mark node %s offline: %w", id, err)
}

// sweeper is the live tier that sweeps the records of the dead tier: the
// one that ranks highest for it.
func sweeper(dead string, live []string) string {
	var best string
	var top uint64
	for _, id := range live {
		h := fnv.New64a()
		h.Write([]byte(dead))
		h.Write([]byte{0})
		h.Write([]byte(id))
		if s := h.Sum64(); best == "" || s > top || s == top && id < best {
			best, top = id, s
		}
	}
	return best
}
