package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/okso-io/okso/schemas"
)

// BucketNodes is the JetStream KV bucket of nodes' records, keyed by node
// id: live nodes, and for a while those that left.
const BucketNodes = "okso_nodes"

// Node is the registry record of one node, written by the tier session
// that owns it when it connects and when it leaves, and by a tier that
// finds it orphaned ([TierLease.Sweep]).
type Node struct {
	NodeID       string               `json:"node_id"`
	Tenant       string               `json:"tenant"`
	SessionID    string               `json:"session_id"`
	Tier         string               `json:"tier"`
	Agent        schemas.Agent        `json:"agent"`
	Capabilities []schemas.Capability `json:"capabilities"`
	ConnectedAt  time.Time            `json:"connected_at"`
	// Name and Labels are the node's, as the tier settled them: the
	// device's own, the operator's winning key by key. Left out when
	// empty, so that readers older than them see the record they know.
	Name   string            `json:"name,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// State is StateOnline (or empty, as older tiers write it) while a
	// session holds the node, StateOffline once it left cleanly. An
	// offline record is kept the registry's offline retention, so that
	// every reader tells a node that left from one never seen.
	State string `json:"state,omitempty"`
	// LastSeen is when the node's session ended; zero while online.
	LastSeen time.Time `json:"last_seen,omitzero"`
	// TierLease: the record is online only while its tier's lease
	// (okso_tiers, key Tier) is alive, and is written only when
	// something changes ([TierLease.Claim]). False: the record is its
	// own lease, refreshed by its session and gone when that stops, as
	// older tiers write it ([Registry.Claim]).
	TierLease bool `json:"tier_lease,omitempty"`
	// BindingRev is the revision of the node's binding its session
	// wrote ([Bindings.Hold]), 0 if none: whoever writes the session's
	// end gives that revision its TTL ([Bindings.Release]), and a claim
	// with an older revision than the record's loses to it
	// ([TierLease.Claim]).
	BindingRev uint64 `json:"binding_rev,omitempty"`
}

// The states of a node's record.
const (
	StateOnline  = "online"
	StateOffline = "offline"
)

// Offline reports whether the record is of a node that left.
func (n *Node) Offline() bool { return n.State == StateOffline }

// Capability returns the node's capability with the given cap_id.
func (n *Node) Capability(capID string) (schemas.Capability, bool) {
	for _, c := range n.Capabilities {
		if c.CapID == capID {
			return c, true
		}
	}
	return schemas.Capability{}, false
}

// DefaultOfflineRetention is how long the registry keeps the record of a
// node that left, unless told otherwise.
const DefaultOfflineRetention = 24 * time.Hour

// RegistryOptions configures the registry's buckets (okso_nodes and
// okso_tiers). The zero value keeps them on file, on one replica, with
// 15 s leases and offline records kept 24 h.
type RegistryOptions struct {
	// TTL is how long a record outlives the last refresh of its lease.
	TTL time.Duration
	// OfflineRetention is how long the record of a node that left is
	// kept (okso's --offline-retention).
	OfflineRetention time.Duration
	Replicas         int
	// Memory keeps the buckets in memory. By default they are on file:
	// a record is written only when something changes, so it must
	// outlive a restart of NATS. An older okso's bucket in memory is
	// moved to file when the registry is opened to make it (not
	// BindOnly).
	Memory bool
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// Registry is the node registry (KV okso_nodes). It is safe for concurrent use.
type Registry struct {
	js        jetstream.JetStream
	kv        jetstream.KeyValue
	tiers     jetstream.KeyValue // okso_tiers: the tiers' leases
	ttl       time.Duration
	retention time.Duration
}

// OpenRegistry binds to the registry bucket, creating it when it does
// not exist.
func OpenRegistry(ctx context.Context, nc *nats.Conn, opts RegistryOptions) (*Registry, error) {
	if opts.TTL <= 0 {
		opts.TTL = 15 * time.Second
	}
	if opts.TTL < time.Second {
		return nil, fmt.Errorf("registry lease %v: NATS message TTLs count whole seconds, use at least 1s", opts.TTL)
	}
	if opts.OfflineRetention <= 0 {
		opts.OfflineRetention = DefaultOfflineRetention
	}
	if opts.OfflineRetention < time.Second {
		return nil, fmt.Errorf("offline retention %v: NATS message TTLs count whole seconds, use at least 1s", opts.OfflineRetention)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	cfg := jetstream.KeyValueConfig{
		Bucket:         BucketNodes,
		Description:    "okso nodes",
		History:        1,
		Storage:        storage(!opts.Memory),
		Replicas:       max(opts.Replicas, 1),
		LimitMarkerTTL: opts.TTL,
	}
	if !opts.BindOnly && !opts.Memory {
		if err := nodesToFile(ctx, js, opts); err != nil {
			return nil, fmt.Errorf("move kv %s to file storage: %w", BucketNodes, err)
		}
	}
	kv, err := openKV(ctx, js, cfg, opts.BindOnly)
	if err != nil {
		return nil, err
	}
	tiers, err := openKV(ctx, js, tiersConfig(opts), opts.BindOnly)
	if err != nil {
		return nil, err
	}
	return &Registry{js: js, kv: kv, tiers: tiers, ttl: opts.TTL, retention: opts.OfflineRetention}, nil
}

// TTL returns the lease duration; a holder refreshes well within it.
func (r *Registry) TTL() time.Duration { return r.ttl }

// ErrLeaseLost is returned by [Lease.Refresh] when the record is no longer
// the one this lease wrote (a newer session took the node, or it expired).
var ErrLeaseLost = errors.New("registry lease lost")

// Lease is one session's claim on a node's record.
// It is not safe for concurrent use; its owner refreshes and releases it.
type Lease struct {
	r   *Registry
	key string
	// tier: the record lives as long as its tier's lease, not its own:
	// it is written without a TTL.
	tier bool
	// node is the record, encoded again on each refresh rather than kept
	// encoded: a tier holds a lease per device, and the record's slices
	// are the session's own.
	node Node
	rev  uint64
	left bool // Leave wrote the node offline: nothing is left to hold
}

// Claim writes n's record, online, with a TTL, replacing any record of the
// node: the record is its own lease, which its holder refreshes well
// within the TTL. That is an older tier's way, whose records a gateway
// still reads (and tests' way of writing a node with no tier); a tier
// claims under its own lease ([TierLease.Claim]).
func (r *Registry) Claim(ctx context.Context, n Node) (*Lease, error) {
	n.State, n.LastSeen = StateOnline, time.Time{}
	data, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	l := &Lease{r: r, key: n.NodeID, node: n}
	ack, err := r.js.Publish(ctx, l.subject(), data, jetstream.WithMsgTTL(r.ttl))
	if err != nil {
		return nil, fmt.Errorf("claim node %s: %w", n.NodeID, err)
	}
	l.rev = ack.Sequence
	return l, nil
}

// Reclaim writes n's record, online, with a TTL, only if the node has no
// record (none yet, or it was removed, or its lease or offline retention
// ran out): a session whose record lapsed (NATS was away longer than the
// lease) takes it again without overwriting a session that claimed the
// node meanwhile. It returns ErrLeaseLost when the node has a record.
func (r *Registry) Reclaim(ctx context.Context, n Node) (*Lease, error) {
	n.State, n.LastSeen = StateOnline, time.Time{}
	data, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	rev, err := r.kv.Create(ctx, n.NodeID, data, jetstream.KeyTTL(r.ttl))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, ErrLeaseLost
	}
	if err != nil {
		return nil, fmt.Errorf("reclaim node %s: %w", n.NodeID, err)
	}
	return &Lease{r: r, key: n.NodeID, node: n, rev: rev}, nil
}

func (l *Lease) subject() string { return "$KV." + BucketNodes + "." + l.key }

// Refresh writes the record again, only if it is still the one the lease
// wrote: a record that is its own lease lives another TTL; one under its
// tier's lease is written again as it is (after the tier's lease
// lapsed, when another tier may have marked it offline).
func (l *Lease) Refresh(ctx context.Context) error {
	if l.left {
		return ErrLeaseLost
	}
	data, err := json.Marshal(l.node)
	if err != nil {
		return err
	}
	opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(l.rev)}
	if !l.tier {
		opts = append(opts, jetstream.WithMsgTTL(l.r.ttl))
	}
	ack, err := l.r.js.Publish(ctx, l.subject(), data, opts...)
	if err != nil {
		if wrongSequence(err) {
			return ErrLeaseLost
		}
		return fmt.Errorf("refresh node %s: %w", l.key, err)
	}
	l.rev = ack.Sequence
	return nil
}

// Current reports whether the node's record is still the one this lease
// wrote last.
func (l *Lease) Current(ctx context.Context) (bool, error) {
	if l.left {
		return false, nil
	}
	now, err := readState(ctx, l.r.js.Conn(), BucketNodes, l.key)
	if err != nil {
		return false, fmt.Errorf("read node %s: %w", l.key, err)
	}
	return now[l.key].seq == l.rev, nil
}

// Release removes the record, only if it is still the one this lease wrote:
// a newer session's record is never removed.
func (l *Lease) Release(ctx context.Context) error {
	if l.left {
		return nil
	}
	err := l.r.kv.Purge(ctx, l.key, jetstream.LastRevision(l.rev), jetstream.PurgeTTL(l.r.ttl))
	if err != nil {
		if wrongSequence(err) {
			return nil // a newer record; not ours to remove
		}
		return fmt.Errorf("release node %s: %w", l.key, err)
	}
	return nil
}

// Leave marks the record offline as of lastSeen, kept the registry's
// offline retention, only if it is still the one this lease wrote: a
// newer session's record is never overwritten, whether the newer session
// wrote before or after this one ended. The lease ends with it.
func (l *Lease) Leave(ctx context.Context, lastSeen time.Time) error {
	n := l.node
	n.State, n.LastSeen = StateOffline, lastSeen.UTC()
	data, err := json.Marshal(n)
	if err != nil {
		return err
	}
	rev := l.rev
	for range claimTries {
		_, err = l.r.js.Publish(ctx, l.subject(), data,
			jetstream.WithMsgTTL(l.r.retention), jetstream.WithExpectLastSequencePerSubject(rev))
		if err == nil || !wrongSequence(err) {
			break
		}
		// Written since: still this session's own online record (written
		// again as it was, by a move of the bucket, say), or not ours to
		// mark.
		now, rerr := readState(ctx, l.r.js.Conn(), BucketNodes, l.key)
		if rerr != nil {
			return fmt.Errorf("mark node %s offline: %w", l.key, rerr)
		}
		e := now[l.key]
		var there Node
		if e.value == nil || json.Unmarshal(e.value, &there) != nil || there.NodeID != l.key ||
			there.SessionID != l.node.SessionID || there.Offline() {
			l.left = true
			return nil
		}
		rev = e.seq
	}
	if err != nil {
		return fmt.Errorf("mark node %s offline: %w", l.key, err)
	}
	l.left = true
	return nil
}

// ErrBadRecord is returned, wrapped, by [Registry.Get] for a record that
// is no node okso wrote: it does not decode as a node of its key's id.
// [Registry.Watch] skips such records, and [Registry.Claim] replaces one.
var ErrBadRecord = errors.New("registry record is not an okso node")

// Get returns the record of a node, online or offline, or nil when there
// is none.
func (r *Registry) Get(ctx context.Context, nodeID string) (*Node, error) {
	e, err := r.kv.Get(ctx, nodeID)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", nodeID, err)
	}
	var n Node
	if err := json.Unmarshal(e.Value(), &n); err != nil {
		return nil, fmt.Errorf("get node %s: %w: %v", nodeID, ErrBadRecord, err)
	}
	if n.NodeID != nodeID {
		return nil, fmt.Errorf("get node %s: %w: it names node %q", nodeID, ErrBadRecord, n.NodeID)
	}
	return &n, nil
}

// WatchRaw is [Registry.Watch] without the decoding, for a watcher that
// needs little of each record or sees most of them unchanged (a refresh
// writes the same bytes again): fn gets each record as stored, or a nil
// value when the node went away, and must not keep value after it
// returns. A value may be one okso did not write.
func (r *Registry) WatchRaw(ctx context.Context, fn func(nodeID string, value []byte, initial bool), ready func()) error {
	return watchKV(ctx, r.js, BucketNodes, func(c kvChange) { fn(c.key, c.value, c.initial) }, ready)
}

// watchKV calls fn for every entry of kv present, then calls ready once,
// then calls fn for every change (a nil value: the key went away), until
// ctx is done. It returns ctx's error, or the watch's if it fails.
func watchKV(ctx context.Context, js jetstream.JetStream, bucket string, fn func(kvChange), ready func()) error {
	return follow(ctx, js.Conn(), bucket, "", fn, ready)
}
