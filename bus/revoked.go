package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketRevoked is the JetStream KV bucket of revoked token ids (jti), shared
// by every gateway and tier.
const BucketRevoked = "okso_revoked"

// MaxRevocation bounds how long a revocation is kept when the token's own
// expiry is unknown; okso refuses tokens without exp, so none lives longer
// than its issuer allows.
const MaxRevocation = 90 * 24 * time.Hour

// Revocations is the set of revoked token ids, kept in step with the
// bucket by [Revocations.Run]. It is safe for concurrent use.
type Revocations struct {
	js jetstream.JetStream
	kv jetstream.KeyValue

	mu  sync.RWMutex
	set map[string]bool
}

// OpenRevocations binds to the bucket, creating it when it does not exist.
func OpenRevocations(ctx context.Context, nc *nats.Conn, replicas int) (*Revocations, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, BucketRevoked)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:         BucketRevoked,
			Description:    "okso revoked token ids",
			History:        1,
			Storage:        jetstream.MemoryStorage,
			Replicas:       max(replicas, 1),
			LimitMarkerTTL: time.Minute,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", BucketRevoked, err)
	}
	return &Revocations{js: js, kv: kv, set: map[string]bool{}}, nil
}

// Revoke records jti as revoked until the token would have expired.
func (r *Revocations) Revoke(ctx context.Context, jti string, until time.Time) error {
	if !validToken(jti) {
		return fmt.Errorf("revoke %q: not a token id", jti)
	}
	ttl := time.Until(until)
	if ttl <= 0 || ttl > MaxRevocation {
		ttl = MaxRevocation
	}
	ttl = max(ttl.Round(time.Second)+time.Second, time.Second)
	_, err := r.js.Publish(ctx, "$KV."+BucketRevoked+"."+jti,
		[]byte(strconv.FormatInt(until.Unix(), 10)), jetstream.WithMsgTTL(ttl))
	if err != nil {
		return fmt.Errorf("revoke %s: %w", jti, err)
	}
	return nil
}

// Revoked reports whether jti is revoked.
func (r *Revocations) Revoked(jti string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.set[jti]
}

// Run follows the bucket until ctx ends, calling onRevoke (if set) for each
// token revoked while it runs, and ready once the present set is loaded.
func (r *Revocations) Run(ctx context.Context, ready func(), onRevoke func(jti string)) error {
	for {
		err := r.watch(ctx, ready, onRevoke)
		if ctx.Err() != nil {
			return nil
		}
		// A watch can end with the connection; follow again.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		_ = err
	}
}

func (r *Revocations) watch(ctx context.Context, ready func(), onRevoke func(string)) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("revocation watch closed")
			}
			if e == nil {
				if ready != nil {
					ready()
				}
				continue
			}
			r.mu.Lock()
			revoked := e.Operation() == jetstream.KeyValuePut
			if revoked {
				r.set[e.Key()] = true
			} else {
				delete(r.set, e.Key()) // expired with its token
			}
			r.mu.Unlock()
			if revoked && onRevoke != nil {
				onRevoke(e.Key())
			}
		}
	}
}
