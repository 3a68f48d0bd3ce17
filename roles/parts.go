package roles

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/tracing"
	"github.com/okso-io/okso/schemas"
)

// shutdownTimeout bounds every graceful stop.
const shutdownTimeout = 5 * time.Second

func shutdownCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), shutdownTimeout)
}

// startTimeout bounds the start of a role: its constructor fails, saying
// why, rather than wait longer (for a NATS cluster whose JetStream never
// forms, say), so that a role that cannot start exits within seconds.
// Three okso processes forming a NATS cluster at once take 2 to 8 s to
// have JetStream and okso's buckets (measured with -race on 2 cores).
const startTimeout = 12 * time.Second

// startContext is the context a role's constructor works within: it ends
// startTimeout from now, for errStartTimeout.
func startContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, startTimeout, errStartTimeout{})
}

// errStartTimeout is why a role's start context ended: the role could
// not start within startTimeout.
type errStartTimeout struct{}

func (errStartTimeout) Error() string { return fmt.Sprintf("not ready within %v", startTimeout) }

// openRegistry opens the registry.
func openRegistry(ctx context.Context, log *slog.Logger, nc *nats.Conn, o bus.RegistryOptions) (*bus.Registry, error) {
	if o.TTL != 0 && o.TTL < time.Second {
		return nil, fmt.Errorf("--lease-ttl %v: at least 1s (NATS message TTLs count whole seconds)", o.TTL)
	}
	if o.OfflineRetention != 0 && o.OfflineRetention < time.Second {
		return nil, fmt.Errorf("--offline-retention %v: at least 1s (NATS message TTLs count whole seconds)", o.OfflineRetention)
	}
	return whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (*bus.Registry, error) {
		return bus.OpenRegistry(ctx, nc, o)
	})
}

// whileJetStreamForms opens one of okso's buckets on nc with open,
// trying again until it succeeds or ctx ends (a role's start context):
// while a NATS cluster is still forming, JetStream has no leader and
// does not answer, or answers "temporarily unavailable". It first asks
// every second whether JetStream answers at all, then opens with 2 s per
// attempt: a start waits little longer than the cluster takes (when
// several processes create one replicated bucket at once, an answer can
// be lost while the bucket is made; the next attempt finds it). A NATS
// without JetStream (its API has no responders) is an error at once:
// waiting would not mend it.
func whileJetStreamForms[T any](ctx context.Context, log *slog.Logger, nc *nats.Conn, open func(context.Context) (T, error)) (T, error) {
	var zero T
	js, err := jetstream.New(nc)
	if err != nil {
		return zero, fmt.Errorf("open jetstream: %w", err)
	}
	if _, err := retryJetStream(ctx, log, time.Second, js.AccountInfo); err != nil {
		return zero, err
	}
	return retryJetStream(ctx, log, 2*time.Second, open)
}

// retryJetStream runs do, each attempt bounded by attempt, until it
// succeeds, fails for want of JetStream, or ctx ends.
func retryJetStream[T any](ctx context.Context, log *slog.Logger, attempt time.Duration, do func(context.Context) (T, error)) (T, error) {
	var last error // of an attempt ctx did not cut short, if any
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		v, err := do(actx)
		cancel()
		if err == nil {
			return v, nil
		}
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: no answer in %v", err, attempt)
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		if errors.Is(err, bus.ErrNoBucket) || errors.Is(err, bus.ErrOldBucket) { // waiting would not mend it
			return v, err
		}
		if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
			errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			// Every server with JetStream answers its API, even while its
			// cluster forms ("temporarily unavailable").
			return v, fmt.Errorf("no JetStream on this NATS (okso keeps its registry in it: enable JetStream): %w", err)
		}
		log.Info("waiting for JetStream", "err", err)
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.As(cause, new(errStartTimeout)) {
				return v, fmt.Errorf("JetStream %v (a NATS cluster has it once a majority of its members are up "+
					"and routed to each other): %w", cause, last)
			}
			return v, last
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// common holds what every server role loads.
type common struct {
	log     *slog.Logger
	schemas *schemas.Set
	signer  *auth.Signer      // nil for a role that only verifies
	public  ed25519.PublicKey // verifies tokens
	extra   []ed25519.PublicKey
	audit   auditLog
	dataDir string // of the signing key, and of the mock node ids' key
	// metrics is where the role's parts register their metrics (nil:
	// none; --metrics-addr serves them).
	metrics prometheus.Registerer
	// tracer makes the spans of the role's parts (nil: off).
	tracer *tracing.Tracer
}

// auditLog says whether and how the auditors of a role log.
type auditLog struct {
	// NoAuditLog leaves audit events out of the log (--log-audit=false);
	// they are published on NATS all the same.
	NoAuditLog bool
	// LogRepeats is the period in which audit lines of a kind are logged
	// once and counted (--log-repeats; 0: each is logged).
	LogRepeats time.Duration
}

// auditor returns an Auditor that publishes on nc and logs unless
// NoAuditLog, bounding its lines by LogRepeats; tick, if set, ends each
// period of it. It logs what it cannot publish either way.
func (c *common) auditor(nc *nats.Conn, tick <-chan time.Time) *bus.Auditor {
	a := &bus.Auditor{NC: nc, ErrorLog: c.log}
	if !c.audit.NoAuditLog {
		a.Log, a.LogRepeats, a.LogTick = c.log, c.audit.LogRepeats, tick
	}
	return a
}

// verifier accepts tokens of the current key and of the keys kept after a
// rotation (data dir keys/*.pub).
func (c *common) verifier(audience string) *auth.Verifier {
	return auth.NewKeySetVerifier(c.public, c.extra, audience)
}

// loadCommon loads the schemas and the signing key of dataDir, creating
// the key on first start.
func loadCommon(log *slog.Logger, dataDir string) (*common, error) {
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	signer, err := auth.LoadOrCreateSigner(dataDir)
	if err != nil {
		return nil, err
	}
	extra, err := auth.LoadExtraKeys(dataDir)
	if err != nil {
		return nil, err
	}
	return &common{log: log, schemas: set, signer: signer, public: signer.Public(), extra: extra, dataDir: dataDir}, nil
}

// loadVerifier is loadCommon for a role that only verifies tokens: with no
// signing.key in dataDir, signing.pub is enough (keep the private key out
// of a cluster). With neither, a key is created, with a warning.
func loadVerifier(log *slog.Logger, dataDir string) (*common, error) {
	if _, err := os.Stat(filepath.Join(dataDir, auth.KeyFile)); err == nil {
		return loadCommon(log, dataDir)
	}
	pub, err := auth.LoadPublicKey(dataDir)
	if errors.Is(err, os.ErrNotExist) {
		log.Warn("no signing key in the data dir: creating one; processes with another data dir will refuse its tokens",
			"data_dir", dataDir)
		return loadCommon(log, dataDir)
	}
	if err != nil {
		return nil, err
	}
	set, err := schemas.Load()
	if err != nil {
		return nil, err
	}
	extra, err := auth.LoadExtraKeys(dataDir)
	if err != nil {
		return nil, err
	}
	return &common{log: log, schemas: set, public: pub, extra: extra, dataDir: dataDir}, nil
}

// openRevocations opens the shared revocation set.
func openRevocations(ctx context.Context, log *slog.Logger, nc *nats.Conn, np *natsPart) (*bus.Revocations, error) {
	return whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (*bus.Revocations, error) {
		// A role's NATS credential may only read the revocations: okso
		// token revoke, the admin's, writes them.
		return bus.OpenRevocations(ctx, nc, bus.RevocationOptions{Replicas: np.replicas, Log: log, ReadOnly: np.bindOnly()})
	})
}

// openKinds binds to the bucket of registered kinds (a role's NATS
// credential may only read it: okso kinds apply, the admin's, writes it).
func openKinds(ctx context.Context, log *slog.Logger, nc *nats.Conn, np *natsPart, set *schemas.Set) (*bus.Kinds, error) {
	return whileJetStreamForms(ctx, log, nc, func(ctx context.Context) (*bus.Kinds, error) {
		return bus.OpenKinds(ctx, nc, bus.KindsOptions{Schemas: set, Replicas: np.replicas, Log: log, BindOnly: np.bindOnly()})
	})
}

// kindTable is a role's kind table, as its follower of okso_kinds last
// made it. Its zero value holds nil (the built-in kinds alone). Safe for
// concurrent use.
type kindTable struct {
	p      atomic.Pointer[schemas.KindTable]
	mu     sync.Mutex
	change chan struct{} // closed and replaced at every store
}

// Load returns the table.
func (k *kindTable) Load() *schemas.KindTable { return k.p.Load() }

func (k *kindTable) store(t *schemas.KindTable) {
	k.p.Store(t)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.change != nil {
		close(k.change)
	}
	k.change = make(chan struct{})
}

// wait returns once cond holds of the table, or ctx ends.
func (k *kindTable) wait(ctx context.Context, cond func(*schemas.KindTable) bool) error {
	for {
		k.mu.Lock()
		if k.change == nil {
			k.change = make(chan struct{})
		}
		ch := k.change
		k.mu.Unlock()
		if cond(k.Load()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// followKinds adds an actor that follows the registered kinds into
// table, and returns a channel closed once the kinds present are in it.
func followKinds(g *run.Group, k *bus.Kinds, table *kindTable) <-chan struct{} {
	loaded := make(chan struct{})
	var once sync.Once
	contextActor(g, func(ctx context.Context) error {
		return k.Run(ctx, func() { once.Do(func() { close(loaded) }) }, table.store)
	})
	return loaded
}

// followRevocations adds an actor that follows the revocation bucket,
// calling onRevoke (if set) for each revoked token id, and returns a
// channel closed once the revocations present are loaded.
func followRevocations(g *run.Group, r *bus.Revocations, onRevoke func(jti string)) <-chan struct{} {
	loaded := make(chan struct{})
	var once sync.Once
	contextActor(g, func(ctx context.Context) error {
		return r.Run(ctx, func() { once.Do(func() { close(loaded) }) }, onRevoke)
	})
	return loaded
}
