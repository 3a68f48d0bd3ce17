package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketNodeTenants is the JetStream KV bucket that binds each node id to
// the tenant that first connected it: key node id, value the tenant.
const BucketNodeTenants = "okso_node_tenants"

// DefaultBindingTTL is how long a node id stays bound to its tenant
// after its last session ended.
const DefaultBindingTTL = 24 * time.Hour

// ErrOtherTenant is returned by [Bindings.Bind], [Bindings.Check],
// [Bindings.Hold] and [Bindings.Rehold] when the node id belongs to
// another tenant.
var ErrOtherTenant = errors.New("node id bound to another tenant")

// BindingsOptions configure the bindings bucket. The zero value keeps
// bindings on file, on one replica, for [DefaultBindingTTL].
type BindingsOptions struct {
	// TTL is how long a binding outlives the last session of its node
	// (24 h).
	TTL      time.Duration
	Replicas int
	// Memory keeps the bucket in memory. By default it is on file: a
	// binding must outlive a restart of NATS, which a live record need not.
	Memory bool
	// Registry, when set, decides for a node id that has no binding yet: a
	// live record of another tenant (written before bindings existed, or
	// by a tier that does not keep them) refuses it like a binding would;
	// the offline record of a node that left does not.
	Registry *Registry
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// Bindings is the set of node id → tenant bindings (KV okso_node_tenants):
// the first tenant whose device connects with a node id owns it until the
// binding expires, TTL after the last session of the node ended, or an
// operator deletes its key. It is safe for concurrent use.
//
// A binding has no TTL while a session holds the node, so nothing
// refreshes it: each session writes it once ([Bindings.Hold]), and its
// end gives it the TTL ([Bindings.Release]) — the session's own, or, for
// a tier that died, the sweep of its nodes ([TierLease.Sweep]). Each
// write is checked against the revision its writer last saw, so the end
// of a session never gives a TTL to the binding of a newer session, which
// wrote its own revision. Nothing else gives a binding its TTL: one
// whose session's end no one wrote stays until an operator deletes it —
// every tier killed and none started since (a tier that starts sweeps
// them), the node's record lost (deleted by hand, or a registry kept in
// memory across a restart of NATS), or its tier's nodes swept by an okso
// older than this, which does not release bindings.
type Bindings struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	ttl time.Duration
	reg *Registry
}

// OpenBindings binds to the bindings bucket, creating it when it does not
// exist: the first process creates it, and no process rewrites another's
// configuration.
func OpenBindings(ctx context.Context, nc *nats.Conn, opts BindingsOptions) (*Bindings, error) {
	if opts.TTL <= 0 {
		opts.TTL = DefaultBindingTTL
	}
	if opts.TTL < time.Second {
		return nil, fmt.Errorf("node binding TTL %v: NATS message TTLs count whole seconds, use at least 1s", opts.TTL)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	b := &Bindings{js: js, ttl: opts.TTL, reg: opts.Registry}
	b.kv, err = openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:         BucketNodeTenants,
		Description:    "okso node id to tenant bindings",
		History:        1,
		Storage:        storage(!opts.Memory),
		Replicas:       max(opts.Replicas, 1),
		LimitMarkerTTL: time.Minute, // per-key TTLs need it
	}, opts.BindOnly)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// TTL returns how long a binding outlives the last session of its node.
func (b *Bindings) TTL() time.Duration { return b.ttl }

// Bind binds nodeID to tenant for a session of the node: it is [Bindings.Check]
// and [Bindings.Hold] at once.
func (b *Bindings) Bind(ctx context.Context, nodeID, tenant string) (owner string, rev uint64, err error) {
	owner, seen, err := b.Check(ctx, nodeID, tenant)
	if err != nil {
		return owner, 0, err
	}
	return b.Hold(ctx, nodeID, tenant, seen)
}

// Check reports whether nodeID is free or tenant's, writing nothing: it
// returns the binding's revision as read (0: none), which
// [Bindings.Hold] expects. When another tenant holds the node id it
// returns that tenant and [ErrOtherTenant].
func (b *Bindings) Check(ctx context.Context, nodeID, tenant string) (owner string, seen uint64, err error) {
	e, err := b.kv.Get(ctx, nodeID)
	switch {
	case err == nil:
		if owner := string(e.Value()); owner != tenant {
			return owner, 0, ErrOtherTenant
		}
		return tenant, e.Revision(), nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if b.reg != nil {
			// A record okso did not write belongs to no tenant: the
			// node's claim will replace it.
			n, err := b.reg.Get(ctx, nodeID)
			if err != nil && !errors.Is(err, ErrBadRecord) {
				return "", 0, fmt.Errorf("bind node %s: %w", nodeID, err)
			}
			if n != nil && !n.Offline() && n.Tenant != tenant {
				return n.Tenant, 0, ErrOtherTenant
			}
		}
		return tenant, 0, nil
	}
	return "", 0, fmt.Errorf("read binding of node %s: %w", nodeID, err)
}

// Hold writes the binding of nodeID to tenant with no TTL, for a session
// that will hold the node, and returns the revision it wrote: the one
// [Bindings.Release] expects at the session's end, and tenant. seen is the binding's
// revision as [Bindings.Check] read it (0: none); when the binding
// changed since, Hold checks it again. Every Hold writes a new revision,
// even of a binding that has no TTL already, so that an older session's
// release no longer matches it. Two tenants holding one free node id at
// once, from any replicas, cannot both succeed: a binding is created
// only where there is none, and written again only if unchanged since
// read; the loser gets the winner and [ErrOtherTenant].
func (b *Bindings) Hold(ctx context.Context, nodeID, tenant string, seen uint64) (owner string, rev uint64, err error) {
	// Each round loses only to a write made since its read; a few rounds
	// settle any real contention.
	for range 4 {
		// Created where there is none (an expected last sequence of 0):
		// unlike KV's Create, a refusal costs no read.
		ack, err := b.js.Publish(ctx, b.subject(nodeID), []byte(tenant), jetstream.WithExpectLastSequencePerSubject(seen))
		if err == nil {
			return tenant, ack.Sequence, nil
		}
		if !wrongSequence(err) {
			return "", 0, fmt.Errorf("bind node %s: %w", nodeID, err)
		}
		// Written since it was read, or deleted by an operator (its
		// marker is a message too): judge it again.
		e, err := b.entry(ctx, nodeID)
		if err != nil {
			return "", 0, err
		}
		if e.value != nil && string(e.value) != tenant {
			return string(e.value), 0, ErrOtherTenant
		}
		seen = e.seq // tenant's, or none (a delete marker's revision, if any)
	}
	return "", 0, fmt.Errorf("bind node %s: its binding kept changing", nodeID)
}

// Release gives the binding of nodeID its TTL, for the session that
// wrote revision rev ([Bindings.Hold]) and has ended: only if the
// binding is still that revision. A newer session's binding (it wrote a
// revision of its own, before or after this one's end) is left as it is,
// with no TTL.
func (b *Bindings) Release(ctx context.Context, nodeID, tenant string, rev uint64) error {
	_, err := b.js.Publish(ctx, b.subject(nodeID), []byte(tenant),
		jetstream.WithMsgTTL(b.ttl), jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil && !wrongSequence(err) {
		return fmt.Errorf("release binding of node %s: %w", nodeID, err)
	}
	return nil
}

// Rehold writes the binding of nodeID again with no TTL, for a session
// that holds the node, wrote revision rev ([Bindings.Hold]), and is about
// to write the node's record again because its tier's lease lapsed: the
// tier that swept the lapsed tier's nodes may have given the binding its
// TTL meanwhile. It returns the binding's revision now: rev when the
// binding is untouched (nothing is written), a new one when it had a TTL
// or was gone. A binding written since with no TTL is a newer session's,
// which holds the node: Rehold writes nothing and returns [ErrLeaseLost].
// Another tenant's returns it and [ErrOtherTenant].
func (b *Bindings) Rehold(ctx context.Context, nodeID, tenant string, rev uint64) (owner string, _ uint64, _ error) {
	e, err := b.entry(ctx, nodeID)
	switch {
	case err != nil:
		return "", 0, err
	case e.seq == rev:
		return tenant, rev, nil
	case e.value == nil: // expired, or deleted by an operator: bind again
		return b.Hold(ctx, nodeID, tenant, e.seq)
	case string(e.value) != tenant:
		return string(e.value), 0, ErrOtherTenant
	case !e.ttl:
		return tenant, 0, ErrLeaseLost
	}
	ack, err := b.js.Publish(ctx, b.subject(nodeID), []byte(tenant), jetstream.WithExpectLastSequencePerSubject(e.seq))
	switch {
	case wrongSequence(err): // held since, by a newer session
		return tenant, 0, ErrLeaseLost
	case err != nil:
		return "", 0, fmt.Errorf("bind node %s: %w", nodeID, err)
	}
	return tenant, ack.Sequence, nil
}

func (b *Bindings) subject(nodeID string) string { return "$KV." + BucketNodeTenants + "." + nodeID }

// entry reads the last message of nodeID's binding: its value is nil
// when there is none, or when it was deleted (seq is then the marker's).
func (b *Bindings) entry(ctx context.Context, nodeID string) (kvEntry, error) {
	now, err := readState(ctx, b.js.Conn(), BucketNodeTenants, nodeID)
	if err != nil {
		return kvEntry{}, fmt.Errorf("read binding of node %s: %w", nodeID, err)
	}
	return now[nodeID], nil
}

// Owner returns the tenant a node id is bound to, or "" when it is free.
func (b *Bindings) Owner(ctx context.Context, nodeID string) (string, error) {
	e, err := b.kv.Get(ctx, nodeID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read binding of node %s: %w", nodeID, err)
	}
	return string(e.Value()), nil
}

// wrongSequence reports whether err is JetStream's refusal of a write
// whose expected last sequence no longer holds.
func wrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
