package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Audit decisions.
const (
	DecisionAllowed    = "allowed"
	DecisionDenied     = "denied"
	DecisionInvalid    = "invalid"
	DecisionNotFound   = "not_found"
	DecisionRateLimit  = "rate_limited"
	DecisionOffline    = "offline"
	DecisionTimeout    = "timeout"
	DecisionFailed     = "failed"
	DecisionLateAck    = "late_ack_dropped"
	DecisionProtocol   = "protocol_violation"
	DecisionRevoked    = "revoked"
	DecisionConnected  = "connected"
	DecisionDisconnect = "disconnected"
)

// AuditEvent is one decision. It never carries arguments, results or any
// device-supplied string.
type AuditEvent struct {
	Time      time.Time     `json:"time"`
	Actor     string        `json:"actor"` // "gateway" or "tier"
	Tenant    string        `json:"tenant,omitempty"`
	Subject   string        `json:"subject,omitempty"`
	JTI       string        `json:"jti,omitempty"`
	Tool      string        `json:"tool,omitempty"`
	NodeID    string        `json:"node_id,omitempty"`
	Decision  string        `json:"decision"`
	Code      string        `json:"code,omitempty"`
	Duration  time.Duration `json:"duration_ns"`
	RequestID string        `json:"request_id,omitempty"`
}

// Auditor records audit events: one structured log line each, and, when it
// has a connection, a message on [Audit] of the event's tenant.
// The zero value discards events. It is safe for concurrent use.
type Auditor struct {
	Log *slog.Logger
	NC  *nats.Conn
}

// Record logs and publishes e.
func (a *Auditor) Record(e AuditEvent) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if a.Log != nil {
		a.Log.LogAttrs(context.Background(), slog.LevelInfo, "audit",
			slog.String("actor", e.Actor),
			slog.String("tenant", e.Tenant),
			slog.String("subject", e.Subject),
			slog.String("jti", e.JTI),
			slog.String("tool", e.Tool),
			slog.String("node_id", e.NodeID),
			slog.String("decision", e.Decision),
			slog.String("code", e.Code),
			slog.Duration("duration", e.Duration),
			slog.String("request_id", e.RequestID),
		)
	}
	if a.NC != nil && ValidTenant(e.Tenant) {
		if b, err := json.Marshal(e); err == nil {
			_ = a.NC.Publish(Audit(e.Tenant), b)
		}
	}
}

// StreamAudit is the optional JetStream stream that keeps audit events.
const StreamAudit = "okso_audit"

// KeepAudit creates (or updates) the audit stream over okso.v1.audit.>,
// keeping events for retention.
func KeepAudit(ctx context.Context, nc *nats.Conn, retention time.Duration, replicas int, file bool) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("open jetstream: %w", err)
	}
	storage := jetstream.MemoryStorage
	if file {
		storage = jetstream.FileStorage
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamAudit,
		Description: "okso audit events",
		Subjects:    []string{subjectPrefix + "audit.>"},
		MaxAge:      retention,
		Storage:     storage,
		Replicas:    max(replicas, 1),
		Discard:     jetstream.DiscardOld,
	})
	if err != nil {
		return fmt.Errorf("keep audit stream: %w", err)
	}
	return nil
}
