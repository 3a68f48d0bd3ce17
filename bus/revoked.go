package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/okso-io/okso/schemas"
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
	js  jetstream.JetStream
	nc  *nats.Conn
	kv  jetstream.KeyValue
	log *slog.Logger

	mu  sync.RWMutex
	set map[string]bool
}

// RevocationOptions configures [OpenRevocations]. The zero value keeps a
// bucket it creates on one replica and logs to [slog.Default].
type RevocationOptions struct {
	// Replicas of the bucket, when this process creates it (or moves it
	// to file storage).
	Replicas int
	// Log says when an older okso's bucket was moved to file storage, and
	// why [Revocations.Run] follows the bucket anew (default
	// slog.Default()).
	Log *slog.Logger
	// ReadOnly is for a connection that may read the bucket but not
	// write it (a role's NATS credential, DESIGN.md §6): a bucket in
	// memory storage is left there, with a warning, for the admin's
	// okso token revoke to move.
	ReadOnly bool
}

// OpenRevocations binds to the bucket, creating it in file storage when
// it does not exist, so that revocations outlive a restart of NATS. A
// bucket in memory storage (as older oksos made it) is moved to
// file storage with its entries: JetStream cannot change a stream's
// storage in place, so it is read, deleted and made again (by whichever
// process opens it first; each that moves it at the same time adds what
// it read). A revocation written by another process in the instant
// between the read and the new bucket is lost; every other survives.
// Other processes that follow the bucket keep their sets meanwhile and
// follow the new one. With o.ReadOnly the bucket must exist, and is
// neither made nor moved.
func OpenRevocations(ctx context.Context, nc *nats.Conn, o RevocationOptions) (*Revocations, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	r := &Revocations{js: js, nc: nc, log: cmp.Or(o.Log, slog.Default()), set: map[string]bool{}}
	if !o.ReadOnly {
		if err := r.keepOnDisk(ctx, o); err != nil {
			return nil, fmt.Errorf("open kv %s: %w", BucketRevoked, err)
		}
	}
	if r.kv, err = openKV(ctx, js, revokedConfig(o.Replicas), o.ReadOnly); err != nil {
		if errors.Is(err, ErrNoBucket) || errors.Is(err, ErrOldBucket) {
			return nil, err
		}
		return nil, fmt.Errorf("%w (revocations must outlive a restart: the NATS servers need JetStream file storage)", err)
	}
	return r, nil
}

// revokedConfig is the bucket's configuration: in file storage.
func revokedConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         BucketRevoked,
		Description:    "okso revoked token ids",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       max(replicas, 1),
		LimitMarkerTTL: time.Minute,
	}
}

// keepOnDisk moves the bucket to file storage if it is in memory.
func (r *Revocations) keepOnDisk(ctx context.Context, o RevocationOptions) error {
	kv, err := r.js.KeyValue(ctx, BucketRevoked)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return err
	}
	if st.Config().Storage == jetstream.FileStorage {
		return nil
	}
	held, err := r.entries(ctx)
	if err != nil {
		return fmt.Errorf("read the memory bucket: %w", err)
	}
	// Another process may have moved it meanwhile: then what was read is
	// added to its bucket, never deleted with it.
	if st, err := kv.Status(ctx); err != nil || st.Config().Storage != jetstream.FileStorage {
		if err := r.js.DeleteKeyValue(ctx, BucketRevoked); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("delete the memory bucket: %w", err)
		}
	}
	if r.kv, err = openKV(ctx, r.js, revokedConfig(o.Replicas), false); err != nil {
		return err
	}
	for jti, until := range held {
		if err := r.Revoke(ctx, jti, until); err != nil {
			return fmt.Errorf("move a revocation to file storage: %w", err)
		}
	}
	r.log.Info("revocations moved to file storage", "bucket", BucketRevoked, "revocations", len(held))
	return nil
}

// entries reads every revocation in the bucket: token id and expiry.
func (r *Revocations) entries(ctx context.Context) (map[string]time.Time, error) {
	state, err := readState(ctx, r.nc, BucketRevoked, ">")
	if err != nil {
		return nil, err
	}
	held := map[string]time.Time{}
	for jti, e := range state {
		if e.value == nil {
			continue
		}
		until := time.Now().Add(MaxRevocation) // when the value says nothing
		if s, err := strconv.ParseInt(string(e.value), 10, 64); err == nil {
			until = time.Unix(s, 0)
		}
		held[jti] = until
	}
	return held, nil
}

// Revoke records jti as revoked until the token would have expired.
func (r *Revocations) Revoke(ctx context.Context, jti string, until time.Time) error {
	if !schemas.ValidToken(jti) {
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
// token revoked while it runs, and ready each time the present set is
// loaded. A watch can end with the connection: Run logs why, as a
// warning, and follows the bucket again a second later. It returns nil
// once ctx ends.
func (r *Revocations) Run(ctx context.Context, ready func(), onRevoke func(jti string)) error {
	for {
		err := r.watch(ctx, ready, onRevoke)
		if ctx.Err() != nil {
			return nil
		}
		r.log.Warn("revocations: watch ended, following again in 1s", "bucket", BucketRevoked, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (r *Revocations) watch(ctx context.Context, ready func(), onRevoke func(string)) error {
	return follow(ctx, r.nc, BucketRevoked, ">", func(c kvChange) {
		jti := c.key
		r.mu.Lock()
		revoked := c.value != nil
		if revoked {
			r.set[jti] = true
		} else {
			delete(r.set, jti) // expired with its token
		}
		r.mu.Unlock()
		if revoked && onRevoke != nil {
			onRevoke(jti)
		}
	}, ready)
}
