package bus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
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
	// DecisionStreamClosed ends a stream; its code is the stream's close code.
	DecisionStreamClosed = "stream_closed"
)

// DecisionFor returns the decision an audit event records for a call
// that failed with code.
func DecisionFor(code string) string {
	switch code {
	case schemas.CodeSafetyDenied:
		return DecisionDenied
	case schemas.CodeManifestInvalid, schemas.CodeBadRequest:
		return DecisionInvalid
	case schemas.CodeToolNotFound:
		return DecisionNotFound
	case schemas.CodeNodeOffline:
		return DecisionOffline
	case schemas.CodeDeadlineExceeded:
		return DecisionTimeout
	case schemas.CodeRateLimited:
		return DecisionRateLimit
	}
	return DecisionFailed
}

// AuditEvent is one decision. It never carries arguments, results or any
// device-supplied string.
type AuditEvent struct {
	Time      time.Time     `json:"time"`
	Actor     string        `json:"actor"` // "gateway", "tier" or "remote"
	Tenant    string        `json:"tenant,omitempty"`
	Subject   string        `json:"subject,omitempty"`
	JTI       string        `json:"jti,omitempty"`
	Tool      string        `json:"tool,omitempty"`
	NodeID    string        `json:"node_id,omitempty"`
	Upstream  string        `json:"upstream,omitempty"` // of a federated tool (DESIGN.md §9.1)
	Caller    string        `json:"caller,omitempty"`   // the caller_id of a relayed call or answer (§9.3)
	Decision  string        `json:"decision"`
	Code      string        `json:"code,omitempty"`
	Duration  time.Duration `json:"duration_ns"`
	RequestID string        `json:"request_id,omitempty"`
	// Parent is the request id of the fleet.call whose fan-out made this
	// node's call.
	Parent string `json:"parent_request_id,omitempty"`
	// Fanout, on a fleet.call's own event, says what the fan-out did.
	Fanout *FanoutAudit `json:"fanout,omitempty"`
	// QueryHash, on a local tool's run (DESIGN.md §12), is the hex SHA-256
	// of the query it was given as TOOL_QUERY: enough to tell whether two
	// runs had the same query, or one a query known to the reader, never
	// the query's text.
	QueryHash string `json:"query_sha256,omitempty"`
}

// FanoutAudit is what one fleet.call did: its verb and plan, and how
// many nodes it targeted, called, and with what outcome. The nodes it
// called are those whose events name its request id as their Parent.
type FanoutAudit struct {
	Tool     string         `json:"tool"` // the verb's name pattern, sysecho.*.echo.invoke
	PlanID   string         `json:"plan_id,omitempty"`
	DryRun   bool           `json:"dry_run,omitempty"`
	Targeted int            `json:"targeted"`
	Sent     int            `json:"sent"` // calls that went to a node
	OK       int            `json:"ok"`
	Failed   map[string]int `json:"failed,omitempty"` // by error code
	// Ended says why the fan-out stopped early: "budget" (--fleet-budget
	// ran out) or "cancelled" (its caller cancelled or hung up).
	Ended string `json:"ended,omitempty"`
}

// Auditor records audit events: one structured log line each when it has
// a Log, and, when it has a connection, a message on [Audit] of the
// event's tenant. Observe, if set, is given each event before it is
// published (so a reader of the subject knows it was observed); it runs
// where the event is written and must be quick. Set the fields before the
// first Record. The zero value discards events. It is safe for concurrent
// use.
//
// Until [Auditor.Start], Record writes each event itself. After it, a
// goroutine of the Auditor's own writes them, in the order they were
// recorded, so that a call's answer never waits for its audit record:
// the record costs a log write and a publish, and at one call in flight
// on one P it would otherwise run between the answer's hops. No event is
// dropped while the process runs: Record waits when the queue is full,
// and [Auditor.Close] writes what is queued; after it, Record writes
// events itself again. A process that crashes loses the events still
// queued (a few at most, short of a stalled log); the publish on NATS
// was never more than best effort.
//
// With LogRepeats, a started Auditor keeps its log bounded whatever its
// peers send: in each period of LogRepeats it logs the first event of a
// kind (actor, tenant, subject, node, decision and code) and only counts
// the others, then writes one line "audit repeated" per kind with how
// many more there were ("more") in how long ("in_last"). Every event is
// still observed and published. A period counts at most maxAuditKinds
// kinds (a caller chooses the node id it names); events of further kinds
// are counted by actor, decision and code alone. The counting is done by
// the Auditor's goroutine: it costs Record nothing.
type Auditor struct {
	Log     *slog.Logger
	NC      *nats.Conn
	Observe func(AuditEvent)
	// LogRepeats is the period of the log's aggregation (0: every event
	// is logged).
	LogRepeats time.Duration
	// LogTick, if set, ends each period in place of a ticker of
	// LogRepeats.
	LogTick <-chan time.Time
	// ErrorLog, if set, says when an event could not be published (the
	// connection closed, or its reconnect buffer full): a warning "audit
	// publish" each, whose repeats a role's log counts.
	ErrorLog *slog.Logger

	mu   sync.RWMutex
	q    chan AuditEvent // nil unless started
	done chan struct{}

	// Published and Failed count the events published on NATS, and
	// those that could not be.
	Published, Failed atomic.Int64
}

// maxAuditKinds bounds the kinds of event counted apart in one period of
// LogRepeats, and so the lines logged in it.
const maxAuditKinds = 64

// auditKind is what makes two audit events alike in the log.
type auditKind struct {
	actor, tenant, subject, nodeID, upstream, caller, decision, code string
}

// auditRepeats counts, for each kind logged in this period, the events
// of that kind not logged. It belongs to the Auditor's goroutine.
type auditRepeats struct {
	since time.Time // start of the period
	more  map[auditKind]int
}

// logs reports whether e is the first of its kind in the period, and
// counts it otherwise. A nil *auditRepeats logs every event.
func (r *auditRepeats) logs(e AuditEvent) bool {
	if r == nil {
		return true
	}
	k := auditKind{e.Actor, e.Tenant, e.Subject, e.NodeID, e.Upstream, e.Caller, e.Decision, e.Code}
	n, ok := r.more[k]
	if !ok && len(r.more) >= maxAuditKinds {
		k = auditKind{actor: e.Actor, decision: e.Decision, code: e.Code}
		n, ok = r.more[k]
	}
	if ok {
		r.more[k] = n + 1
		return false
	}
	r.more[k] = 0
	return true
}

// flush writes a line for each kind with events not logged, and starts a
// new period at now.
func (r *auditRepeats) flush(log *slog.Logger, now time.Time) {
	if r == nil {
		return
	}
	in := now.Sub(r.since).Round(time.Millisecond).String()
	kinds := slices.SortedFunc(maps.Keys(r.more), func(a, b auditKind) int {
		return cmp.Or(strings.Compare(a.actor, b.actor), strings.Compare(a.tenant, b.tenant),
			strings.Compare(a.subject, b.subject), strings.Compare(a.nodeID, b.nodeID), strings.Compare(a.upstream, b.upstream),
			strings.Compare(a.decision, b.decision), strings.Compare(a.code, b.code))
	})
	for _, k := range kinds {
		if n := r.more[k]; n > 0 {
			attrs := []slog.Attr{
				slog.String("actor", k.actor),
				slog.String("tenant", k.tenant),
				slog.String("subject", k.subject),
				slog.String("node_id", k.nodeID),
			}
			if k.upstream != "" {
				attrs = append(attrs, slog.String("upstream", k.upstream))
			}
			attrs = append(attrs,
				slog.String("decision", k.decision),
				slog.String("code", k.code),
				slog.Int("more", n),
				slog.String("in_last", in),
			)
			log.LogAttrs(context.Background(), slog.LevelInfo, "audit repeated", attrs...)
		}
	}
	clear(r.more)
	r.since = now
}

// auditQueue is how many events wait for the Auditor's goroutine before
// Record waits.
const auditQueue = 4096

// Start hands events to a goroutine of the Auditor's own until Close.
func (a *Auditor) Start() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.q != nil {
		return
	}
	q, done := make(chan AuditEvent, auditQueue), make(chan struct{})
	a.q, a.done = q, done
	var (
		rep  *auditRepeats
		tick <-chan time.Time
		stop = func() {}
	)
	if a.LogRepeats > 0 && a.Log != nil {
		rep = &auditRepeats{since: time.Now(), more: map[auditKind]int{}}
		if tick = a.LogTick; tick == nil {
			t := time.NewTicker(a.LogRepeats)
			tick, stop = t.C, t.Stop
		}
	}
	go func() {
		defer close(done)
		defer stop()
		var scratch auditScratch
		for {
			select {
			case e, ok := <-q:
				if !ok {
					rep.flush(a.Log, time.Now())
					return
				}
				a.write(e, rep, &scratch)
			case now := <-tick:
				rep.flush(a.Log, now)
			}
		}
	}()
}

// Close writes the queued events (and the repeats counted) and stops the
// goroutine Start began.
// Events recorded meanwhile wait for the queue to be written, then are
// written by Record itself, after it.
func (a *Auditor) Close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.q != nil {
		close(a.q) // senders holding the read lock are drained first
		<-a.done
		a.q = nil
	}
}

// Record logs and publishes e.
func (a *Auditor) Record(e AuditEvent) {
	if a == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	a.mu.RLock()
	if a.q != nil {
		a.q <- e
		a.mu.RUnlock()
		return
	}
	a.mu.RUnlock()
	a.write(e, nil, nil)
}

// auditScratch is what the Auditor's goroutine keeps from one event to
// the next: the buffer it encodes into (a publish copies it) and the
// subject of the last tenant it published for.
type auditScratch struct {
	buf             []byte
	tenant, subject string
}

// write logs e (unless rep counts it), then observes and publishes it,
// with s as its scratch (nil: none).
func (a *Auditor) write(e AuditEvent, rep *auditRepeats, s *auditScratch) {
	if a.Log != nil && rep.logs(e) {
		// A call reaches a node, an upstream or a caller, never two.
		where, at := "node_id", e.NodeID
		if e.Upstream != "" {
			where, at = "upstream", e.Upstream
		} else if e.Caller != "" {
			where, at = "caller", e.Caller
		}
		attrs := []slog.Attr{
			slog.String("actor", e.Actor),
			slog.String("tenant", e.Tenant),
			slog.String("subject", e.Subject),
			slog.String("jti", e.JTI),
			slog.String("tool", e.Tool),
			slog.String(where, at),
			slog.String("decision", e.Decision),
			slog.String("code", e.Code),
			slog.Duration("duration", e.Duration),
			slog.String("request_id", e.RequestID),
		}
		if e.Parent != "" {
			attrs = append(attrs, slog.String("parent_request_id", e.Parent))
		}
		if e.QueryHash != "" {
			attrs = append(attrs, slog.String("query_sha256", e.QueryHash))
		}
		if f := e.Fanout; f != nil {
			attrs = append(attrs, slog.Group("fanout", slog.String("tool", f.Tool), slog.String("plan_id", f.PlanID),
				slog.Bool("dry_run", f.DryRun), slog.Int("targeted", f.Targeted), slog.Int("sent", f.Sent),
				slog.Int("ok", f.OK), slog.Any("failed", f.Failed), slog.String("ended", f.Ended)))
		}
		a.Log.LogAttrs(context.Background(), slog.LevelInfo, "audit", attrs...)
	}
	if a.Observe != nil {
		a.Observe(e)
	}
	if a.NC != nil && schemas.ValidTenant(e.Tenant) {
		var (
			b   []byte
			err error
		)
		subject := ""
		if s != nil {
			if s.tenant != e.Tenant || s.subject == "" {
				s.tenant, s.subject = e.Tenant, Audit(e.Tenant)
			}
			b, err = e.appendJSON(s.buf[:0])
			s.buf, subject = b[:0], s.subject
		} else {
			b, err = e.encode()
			subject = Audit(e.Tenant)
		}
		if err == nil {
			err = a.NC.Publish(subject, b)
		}
		if err != nil {
			a.Failed.Add(1)
			if a.ErrorLog != nil {
				a.ErrorLog.Warn("audit publish", "actor", e.Actor, "tenant", e.Tenant, "decision", e.Decision, "err", err)
			}
		} else {
			a.Published.Add(1)
		}
	}
}

// encode encodes e as json.Marshal would, by hand when it can: every
// string printable ASCII that needs no escaping, and a time
// json.Marshal writes as RFC 3339 with whole-minute offsets.
func (e AuditEvent) encode() ([]byte, error) { return e.appendJSON(nil) }

// appendJSON appends e to b as encode encodes it.
func (e AuditEvent) appendJSON(b []byte) ([]byte, error) {
	_, offset := e.Time.Zone()
	if y := e.Time.Year(); y < 0 || y > 9999 || offset%60 != 0 || e.Fanout != nil { // a fan-out's: one per fleet.call
		return marshalAppend(b, e)
	}
	strs := [...]string{e.Actor, e.Tenant, e.Subject, e.JTI, e.Tool, e.NodeID, e.Upstream, e.Caller, e.Decision, e.Code, e.RequestID, e.Parent, e.QueryHash}
	n := 160
	for _, s := range strs {
		if !jsonscan.HTMLSafe(s) {
			return marshalAppend(b, e)
		}
		n += len(s)
	}
	b = slices.Grow(b, n)
	b = append(b, `{"time":"`...)
	b = e.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","actor":"`...)
	b = append(b, e.Actor...)
	b = append(b, '"')
	b = appendMember(b, "tenant", e.Tenant, true)
	b = appendMember(b, "subject", e.Subject, true)
	b = appendMember(b, "jti", e.JTI, true)
	b = appendMember(b, "tool", e.Tool, true)
	b = appendMember(b, "node_id", e.NodeID, true)
	b = appendMember(b, "upstream", e.Upstream, true)
	b = appendMember(b, "caller", e.Caller, true)
	b = appendMember(b, "decision", e.Decision, false)
	b = appendMember(b, "code", e.Code, true)
	b = append(b, `,"duration_ns":`...)
	b = strconv.AppendInt(b, int64(e.Duration), 10)
	b = appendMember(b, "request_id", e.RequestID, true)
	b = appendMember(b, "parent_request_id", e.Parent, true)
	b = appendMember(b, "query_sha256", e.QueryHash, true)
	return append(b, '}'), nil
}

// marshalAppend appends json.Marshal's encoding of e to b.
func marshalAppend(b []byte, e AuditEvent) ([]byte, error) {
	m, err := json.Marshal(e)
	if err != nil {
		return b, err
	}
	if b == nil {
		return m, nil
	}
	return append(b, m...), nil
}

// appendMember appends ,"key":"s" unless s is empty and omitted.
func appendMember(b []byte, key, s string, omitEmpty bool) []byte {
	if s == "" && omitEmpty {
		return b
	}
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":"`...)
	b = append(b, s...)
	return append(b, '"')
}

// StreamAudit is the optional JetStream stream that keeps audit events.
const StreamAudit = "okso_audit"

// KeepAudit creates the audit stream over okso.v1.audit.>, keeping events
// for retention, unless it exists: then it checks that it keeps the
// audit alone, and sets its retention. With bindOnly (a gateway's NATS
// credential may neither create nor change it) the stream must exist,
// and a retention of another is [ErrOtherRetention].
func KeepAudit(ctx context.Context, nc *nats.Conn, retention time.Duration, replicas int, file, bindOnly bool) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("open jetstream: %w", err)
	}
	cfg := jetstream.StreamConfig{
		Name:        StreamAudit,
		Description: "okso audit events",
		Subjects:    []string{subjectPrefix + "audit.>"},
		MaxAge:      retention,
		Storage:     storage(file),
		Replicas:    max(replicas, 1),
		Discard:     jetstream.DiscardOld,
		AllowDirect: true, // the audit role reads it with direct gets
	}
	st, err := js.Stream(ctx, StreamAudit)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && bindOnly:
		return fmt.Errorf("keep audit stream %s: %w", StreamAudit, ErrNoBucket)
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = js.CreateStream(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("keep audit stream: %w", err)
	}
	got := st.CachedInfo().Config
	if !slices.Equal(got.Subjects, cfg.Subjects) || got.RePublish != nil || got.Mirror != nil || len(got.Sources) > 0 ||
		got.SubjectTransform != nil {
		return fmt.Errorf("keep audit stream: %s exists, but keeps more than the audit (subjects %v): delete it with the admin's NATS credential",
			StreamAudit, got.Subjects)
	}
	if got.MaxAge == retention && got.AllowDirect {
		return nil
	}
	if bindOnly {
		if got.MaxAge != retention {
			return fmt.Errorf("%w: %s keeps events %v, not %v (okso nats init --audit-retention changes it)",
				ErrOtherRetention, StreamAudit, got.MaxAge, retention)
		}
		return nil
	}
	got.MaxAge, got.AllowDirect = retention, true
	if _, err := js.UpdateStream(ctx, got); err != nil {
		return fmt.Errorf("keep audit stream: %w", err)
	}
	return nil
}

// ErrOtherRetention is returned, wrapped, by [KeepAudit] when the audit
// stream exists with another retention, which it keeps.
var ErrOtherRetention = errors.New("the audit stream keeps events for another time")
