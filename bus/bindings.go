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

// DefaultBindingTTL is how long a node id stays bound to its tenant after
// the last refresh of the binding.
const DefaultBindingTTL = 24 * time.Hour

// maxBindingRefresh bounds the time between two refreshes of a live
// node's binding, so that a node that leaves is remembered for nearly the
// whole TTL.
const maxBindingRefresh = time.Hour

// ErrOtherTenant is returned by [Bindings.Bind] when the node id belongs
// to another tenant.
var ErrOtherTenant = errors.New("node id bound to another tenant")

// BindingsOptions configure the bindings bucket. The zero value keeps
// bindings on file, on one replica, for [DefaultBindingTTL].
type BindingsOptions struct {
	// TTL is how long a binding outlives its last refresh (24 h).
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
// binding expires, TTL after the last session of the node refreshed it,
// or an operator deletes its key. It is safe for concurrent use.
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

// TTL returns how long a binding outlives its last refresh.
func (b *Bindings) TTL() time.Duration { return b.ttl }

// RefreshEvery returns how often the holder of a live node refreshes its
// binding: a quarter of the TTL, at most an hour.
func (b *Bindings) RefreshEvery() time.Duration { return min(b.ttl/4, maxBindingRefresh) }

// Bind binds nodeID to tenant when the node id is free, and refreshes the
// binding when tenant holds it already; either way the binding then lasts
// TTL. When another tenant holds the node id it returns that tenant and
// [ErrOtherTenant] and writes nothing. Two tenants binding one free node
// id at once, from any replicas, cannot both succeed: a binding is created
// only where there is none, and refreshed only if unchanged since read.
func (b *Bindings) Bind(ctx context.Context, nodeID, tenant string) (owner string, err error) {
	// Each round loses only to a write made since its read; a few rounds
	// settle any real contention.
	for range 4 {
		e, err := b.kv.Get(ctx, nodeID)
		switch {
		case err == nil:
			if owner := string(e.Value()); owner != tenant {
				return owner, ErrOtherTenant
			}
			_, err := b.js.Publish(ctx, "$KV."+BucketNodeTenants+"."+nodeID, []byte(tenant),
				jetstream.WithMsgTTL(b.ttl), jetstream.WithExpectLastSequencePerSubject(e.Revision()))
			if wrongSequence(err) {
				continue
			}
			if err != nil {
				return "", fmt.Errorf("refresh binding of node %s: %w", nodeID, err)
			}
			return tenant, nil
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if b.reg != nil {
				// A record okso did not write belongs to no tenant: the
				// node's claim will replace it.
				n, err := b.reg.Get(ctx, nodeID)
				if err != nil && !errors.Is(err, ErrBadRecord) {
					return "", fmt.Errorf("bind node %s: %w", nodeID, err)
				}
				if n != nil && !n.Offline() && n.Tenant != tenant {
					return n.Tenant, ErrOtherTenant
				}
			}
			_, err := b.kv.Create(ctx, nodeID, []byte(tenant), jetstream.KeyTTL(b.ttl))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			if err != nil {
				return "", fmt.Errorf("bind node %s: %w", nodeID, err)
			}
			return tenant, nil
		default:
			return "", fmt.Errorf("read binding of node %s: %w", nodeID, err)
		}
	}
	return "", fmt.Errorf("bind node %s: its binding kept changing", nodeID)
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
