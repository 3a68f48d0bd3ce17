package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketTiers is the JetStream KV bucket of the device tiers' leases,
// keyed by tier instance id: a small heartbeat each tier writes every
// third of its TTL. A node's record under a tier's lease is online only
// while that lease is alive, so a tier that dies takes its nodes offline
// with no write per node, and no write per node is periodic.
const BucketTiers = "okso_tiers"

// tiersConfig is the configuration of the tiers' bucket: stored like the
// records whose liveness it says.
func tiersConfig(o RegistryOptions) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         BucketTiers,
		Description:    "okso device tiers' leases",
		History:        1,
		Storage:        storage(!o.Memory),
		Replicas:       max(o.Replicas, 1),
		LimitMarkerTTL: o.TTL,
	}
}

// tierBeat is the value of a tier's lease: who holds it, and since when.
// When it was last refreshed is when JetStream stored it.
type tierBeat struct {
	Tier      string    `json:"tier"`
	StartedAt time.Time `json:"started_at"`
	// TTLMs is the lease's TTL: a sweeper gives a tier whose lease it
	// finds gone that long to take it again before it marks its nodes
	// offline (NATS may have been away from every tier at once).
	TTLMs int64 `json:"ttl_ms"`
}

// TierLease is one tier instance's lease (a key of okso_tiers). Its
// holder refreshes it every third of the registry's TTL; the nodes it
// claims ([TierLease.Claim]) are online while it is alive. It is not
// safe for concurrent use.
type TierLease struct {
	r       *Registry
	id      string
	value   []byte
	rev     uint64
	started time.Time
}

// ErrBadTier is returned, wrapped, by [Registry.HoldTier] for a tier id
// that cannot be a key.
var ErrBadTier = errors.New("tier id is not a valid key")

// HoldTier takes the lease of tier instance id, which must be unique to
// this instance (tiers name themselves at random): it is written with
// the registry's TTL, whatever was there.
func (r *Registry) HoldTier(ctx context.Context, id string) (*TierLease, error) {
	if !ValidTierID(id) {
		return nil, fmt.Errorf("hold tier lease %q: %w", id, ErrBadTier)
	}
	l := &TierLease{r: r, id: id, started: time.Now().UTC()}
	var err error
	if l.value, err = json.Marshal(tierBeat{Tier: id, StartedAt: l.started, TTLMs: r.ttl.Milliseconds()}); err != nil {
		return nil, err
	}
	if err := l.put(ctx, false); err != nil {
		return nil, err
	}
	return l, nil
}

// ValidTierID reports whether s can name a tier instance: letters,
// digits, '-' and '_', at most 128 of them (a key of okso_tiers).
func ValidTierID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// ID returns the tier instance id the lease is of.
func (l *TierLease) ID() string { return l.id }

func (l *TierLease) put(ctx context.Context, checked bool) error {
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(l.r.ttl)}
	if checked {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(l.rev))
	}
	ack, err := l.r.js.Publish(ctx, "$KV."+BucketTiers+"."+l.id, l.value, opts...)
	if err != nil {
		if checked && wrongSequence(err) {
			return ErrLeaseLost
		}
		return fmt.Errorf("write tier lease %s: %w", l.id, err)
	}
	l.rev = ack.Sequence
	return nil
}

// Refresh extends the lease another TTL. When the lease had lapsed
// meanwhile (NATS was away, or the holder late, longer than the TTL), it
// takes it again and reports lapsed: every reader saw the tier's nodes
// go offline, and another tier may have marked their records offline
// ([TierLease.Sweep]), so the holder writes its nodes' records again
// ([Lease.Refresh]).
func (l *TierLease) Refresh(ctx context.Context) (lapsed bool, err error) {
	err = l.put(ctx, true)
	if !errors.Is(err, ErrLeaseLost) {
		return false, err
	}
	return true, l.put(ctx, false)
}

// Release ends the lease at once (a clean shutdown, once its sessions
// have left): nodes it still holds go offline at every reader.
func (l *TierLease) Release(ctx context.Context) error {
	err := l.r.tiers.Purge(ctx, l.id, jetstream.LastRevision(l.rev), jetstream.PurgeTTL(l.r.ttl))
	if err != nil && !wrongSequence(err) {
		return fmt.Errorf("release tier lease %s: %w", l.id, err)
	}
	return nil
}

// Claim writes n's record under the tier's lease: online, with no TTL.
// It stays until the session leaves ([Lease.Leave]) or the tier's lease
// lapses and another tier marks it offline ([TierLease.Sweep]); nothing
// refreshes it. It replaces any record of the node but a newer
// session's, for which it returns ErrLeaseLost: the write is checked
// against the record read, so an older session's claim that crosses a
// newer one's never lands after it. The newer session is the one that
// wrote the node's binding last (the greater [Node.BindingRev]), which
// alone can give the binding its TTL when it ends; between records that
// do not both say, the greater session id (session ids are ULIDs).
func (l *TierLease) Claim(ctx context.Context, n Node) (*Lease, error) { return l.claim(ctx, n, false) }

// ClaimNew is [TierLease.Claim] for a node that likely has no record (its
// binding was free): it first writes the record only where there is none,
// one write instead of a read and a write; when there is a record after
// all, it reads and judges it as Claim does.
func (l *TierLease) ClaimNew(ctx context.Context, n Node) (*Lease, error) {
	return l.claim(ctx, n, true)
}

func (l *TierLease) claim(ctx context.Context, n Node, fresh bool) (*Lease, error) {
	n.State, n.LastSeen = StateOnline, time.Time{}
	n.Tier, n.TierLease = l.id, true
	data, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	ls := &Lease{r: l.r, key: n.NodeID, node: n, tier: true}
	for i := range claimTries {
		var e kvEntry // none, if fresh
		if !fresh || i > 0 {
			now, err := readState(ctx, l.r.js.Conn(), BucketNodes, n.NodeID)
			if err != nil {
				return nil, fmt.Errorf("claim node %s: %w", n.NodeID, err)
			}
			e = now[n.NodeID]
		}
		var there Node
		if e.value != nil && json.Unmarshal(e.value, &there) == nil && there.NodeID == n.NodeID && newer(&there, &n) {
			return nil, ErrLeaseLost
		}
		ack, err := l.r.js.Publish(ctx, ls.subject(), data, jetstream.WithExpectLastSequencePerSubject(e.seq))
		if err != nil && wrongSequence(err) {
			continue // written meanwhile: judge it
		}
		if err != nil {
			return nil, fmt.Errorf("claim node %s: %w", n.NodeID, err)
		}
		ls.rev = ack.Sequence
		return ls, nil
	}
	return nil, fmt.Errorf("claim node %s: written by others %d times while claiming", n.NodeID, claimTries)
}

// newer reports whether a's session is newer than b's: it wrote the
// node's binding after b's did, or, when either record does not say, its
// session id is the greater.
func newer(a, b *Node) bool {
	if a.BindingRev != 0 && b.BindingRev != 0 {
		return a.BindingRev > b.BindingRev
	}
	return a.SessionID > b.SessionID
}

// claimTries bounds the reads of one claim that others' writes overtake.
const claimTries = 8
