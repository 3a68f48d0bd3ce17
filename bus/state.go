package bus

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// StateOptions configure [InitState]. The zero value keeps okso's
// buckets on one replica, with no audit stream.
type StateOptions struct {
	// Replicas of the buckets (and of the audit stream).
	Replicas int
	// AuditRetention, when above zero, also keeps the audit stream
	// (okso_audit) this long.
	AuditRetention time.Duration
	// Log says when an older okso's revocations were moved to file
	// storage (default slog.Default()).
	Log *slog.Logger
}

// InitState makes okso's buckets (and the audit stream), or brings those
// an older okso made to what this one needs; those that are ready it
// leaves as they are. Where okso's roles are kept apart (DESIGN.md §6)
// they may not make them: the admin does, once, before they start (okso
// nats init, or the okso process that embeds NATS). nc is the admin's,
// or any connection to a NATS that admits anyone.
func InitState(ctx context.Context, nc *nats.Conn, o StateOptions) error {
	if _, err := OpenRegistry(ctx, nc, RegistryOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := OpenBindings(ctx, nc, BindingsOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := OpenRemotes(ctx, nc, RemotesOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := OpenCallers(ctx, nc, CallersOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := OpenRevocations(ctx, nc, RevocationOptions{Replicas: o.Replicas, Log: o.Log}); err != nil {
		return err
	}
	if _, err := OpenOAuth(ctx, nc, OAuthOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := OpenPlans(ctx, nc, PlansOptions{Replicas: o.Replicas}); err != nil {
		return err
	}
	if _, err := openKindsKV(ctx, nc, o.Replicas, false); err != nil {
		return err
	}
	if o.AuditRetention > 0 {
		return KeepAudit(ctx, nc, o.AuditRetention, o.Replicas, false, false)
	}
	return nil
}
