package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/schemas"
)

// BucketCallers is the JetStream KV bucket of the callers' tool
// declarations, keyed by listen id, and of the claims on caller ids,
// keyed by [ClaimKey] (DESIGN.md §4, §9.3).
const BucketCallers = "okso_callers"

// claimPrefix starts the key of every claim in okso_callers. A listen id
// (a lower-case ULID) has no dot, so no declaration's key starts so.
const claimPrefix = "claim."

// ClaimKey is the key in okso_callers of the claim on a caller id of a
// tenant.
func ClaimKey(tenant, callerID string) string { return claimPrefix + tenant + "." + callerID }

// CallerReq is the request/reply subject of the calls relayed to one
// listen: the gateway replica holding it answers.
func CallerReq(listenID string) string { return subjectPrefix + "caller." + listenID + ".req" }

// CallerResp is the subject on which a caller_tool_response that landed
// on another replica reaches the replica holding the listen. It is sent
// as a request: the holder answers whether it took the response.
func CallerResp(listenID string) string { return subjectPrefix + "caller." + listenID + ".resp" }

// HeaderControl marks a message of okso's own on a listen's subjects:
// [ControlReplaced] says that a newer listen of the same caller id in the
// same tenant replaces it.
const HeaderControl = "Okso-Control"

// ControlReplaced is the [HeaderControl] value that ends a listen.
const ControlReplaced = "replaced"

// ControlCancelled is the [HeaderControl] value that withdraws one
// relayed call, named by its [HeaderRelayID]: its caller gave up.
const ControlCancelled = "cancelled"

// HeaderRelayID names one relayed call on the listen's subjects.
const HeaderRelayID = "Okso-Relay-Id"

// Caller is one live declaration of a caller's tools, written by the
// gateway replica holding its listen call.
type Caller struct {
	ListenID string       `json:"listen_id"`
	Tenant   string       `json:"tenant"`
	Subject  string       `json:"subject"` // the token subject of the listener
	CallerID string       `json:"caller_id"`
	Since    time.Time    `json:"since"` // when the listen began: of two with one caller id, the later wins
	Tools    []CallerTool `json:"tools"`
}

// CallerTool is one declared tool, under the caller's own name.
type CallerTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
	ReadOnly    bool            `json:"read_only,omitempty"`
}

// CallersOptions configures the bucket. The zero value keeps it in
// memory, on one replica, with a 15 s lease.
type CallersOptions struct {
	TTL      time.Duration
	Replicas int
	File     bool
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// Callers is the declaration registry (KV okso_callers). It is safe for
// concurrent use. Each declaration has one writer, the replica holding
// the listen; a claim is written by whichever listen takes it
// ([Callers.Claim]).
type Callers struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	ttl time.Duration
}

// OpenCallers creates the bucket, or binds to it when it exists.
func OpenCallers(ctx context.Context, nc *nats.Conn, opts CallersOptions) (*Callers, error) {
	js, kv, ttl, err := openLeased(ctx, nc, BucketCallers, "okso caller-tool declarations", opts.TTL, opts.Replicas, opts.File, opts.BindOnly)
	if err != nil {
		return nil, err
	}
	return &Callers{kv: kv, js: js, ttl: ttl}, nil
}

// TTL returns the lease duration; the holder puts again well within it.
func (c *Callers) TTL() time.Duration { return c.ttl }

// Put writes a declaration with the lease's TTL.
func (c *Callers) Put(ctx context.Context, rec *Caller) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := c.js.Publish(ctx, "$KV."+BucketCallers+"."+rec.ListenID, data, jetstream.WithMsgTTL(c.ttl)); err != nil {
		return fmt.Errorf("put listen %s: %w", rec.ListenID, err)
	}
	return nil
}

// Delete removes a declaration: its listen ended.
func (c *Callers) Delete(ctx context.Context, listenID string) error {
	if err := c.kv.Purge(ctx, listenID, jetstream.PurgeTTL(c.ttl)); err != nil {
		return fmt.Errorf("delete listen %s: %w", listenID, err)
	}
	return nil
}

// CallerEvent is one change of the bucket seen by [Callers.Watch].
type CallerEvent struct {
	ListenID string
	Caller   *Caller // nil when the listen ended
	Initial  bool
	// Expired: the declaration went away because its lease ran out (the
	// gateway holding the listen stopped refreshing it), not because that
	// gateway removed it.
	Expired bool
	// Invalid: a record is there, but none okso wrote.
	Invalid bool
}

// Watch calls fn for every declaration present, then ready once, then fn
// for every change, until ctx is done. A record that does not decode, or
// names another listen, is reported as gone. Claims are no declarations:
// Watch passes over them.
func (c *Callers) Watch(ctx context.Context, fn func(CallerEvent), ready func()) error {
	return watchKV(ctx, c.js, BucketCallers, func(ch kvChange) {
		if strings.HasPrefix(ch.key, claimPrefix) {
			return
		}
		ev := CallerEvent{ListenID: ch.key, Initial: ch.initial, Expired: ch.expired}
		if ch.value != nil {
			var rec Caller
			if json.Unmarshal(ch.value, &rec) == nil && rec.ListenID == ch.key {
				ev.Caller = &rec
			} else {
				ev.Invalid = true
			}
		}
		if ev.Caller == nil && ch.initial {
			return
		}
		fn(ev)
	}, ready)
}

// A caller id is held by one agent (tenant and token subject) at a time,
// on every replica: the listen that holds it has a claim, a key of
// okso_callers ([ClaimKey]) created only where there is none and changed
// only by a compare-and-set on its revision, leased like a declaration.
// A crashed holder keeps it for the lease, no longer.

// ErrCallerHeld is returned by [Callers.Claim] when another agent of the
// tenant holds the caller id.
var ErrCallerHeld = errors.New("caller id held by another agent")

// ErrClaimLost is returned by [CallerLease.Refresh] when the claim is no
// longer the one the lease wrote: a newer listen of the same agent took
// it over, or it lapsed (and perhaps another agent took it).
var ErrClaimLost = errors.New("caller id claim lost")

// CallerClaim is the value of a claim: which listen, of which agent,
// holds a caller id.
type CallerClaim struct {
	ListenID string `json:"listen_id"`
	Tenant   string `json:"tenant"`
	Subject  string `json:"subject"`
	CallerID string `json:"caller_id"`
}

// CallerLease is one listen's claim on a caller id. It is not safe for
// concurrent use; its owner refreshes and releases it.
type CallerLease struct {
	c        *Callers
	key      string
	data     []byte
	rev      uint64
	replaced string
}

// Replaced returns the listen of the same agent whose claim this one took
// over, "" when the caller id was free: that listen is over.
func (l *CallerLease) Replaced() string { return l.replaced }

// Claim takes the caller id of cl's tenant for cl's listen. When the id
// is free (or its claim lapsed) the claim is created; when the same agent
// (tenant and subject) holds it, the claim is taken over by a
// compare-and-set on its revision ([CallerLease.Replaced] names the
// listen that had it); when another agent holds it, Claim returns
// [ErrCallerHeld] and writes nothing. Two agents claiming one id at once,
// on any replicas, cannot both succeed.
func (c *Callers) Claim(ctx context.Context, cl CallerClaim) (*CallerLease, error) {
	if !schemas.ValidToken(cl.Tenant) || !schemas.ValidToken(cl.CallerID) || cl.ListenID == "" {
		return nil, fmt.Errorf("claim caller id %q of tenant %q: not a key okso makes", cl.CallerID, cl.Tenant)
	}
	data, err := json.Marshal(cl)
	if err != nil {
		return nil, err
	}
	key := ClaimKey(cl.Tenant, cl.CallerID)
	// Each round loses only to a write made since its read; a few rounds
	// settle any real contention.
	for range 4 {
		e, err := c.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound): // none, or deleted, purged, lapsed
			rev, err := c.kv.Create(ctx, key, data, jetstream.KeyTTL(c.ttl))
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("claim caller id %s: %w", cl.CallerID, err)
			}
			return &CallerLease{c: c, key: key, data: data, rev: rev}, nil
		case err != nil:
			return nil, fmt.Errorf("read claim of caller id %s: %w", cl.CallerID, err)
		}
		var held CallerClaim
		if json.Unmarshal(e.Value(), &held) == nil && held.Subject != cl.Subject {
			return nil, ErrCallerHeld
		}
		// The agent's own (or no claim okso wrote): taken over only if
		// unchanged since read.
		ack, err := c.js.Publish(ctx, "$KV."+BucketCallers+"."+key, data,
			jetstream.WithMsgTTL(c.ttl), jetstream.WithExpectLastSequencePerSubject(e.Revision()))
		if wrongSequence(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("take over claim of caller id %s: %w", cl.CallerID, err)
		}
		return &CallerLease{c: c, key: key, data: data, rev: ack.Sequence, replaced: held.ListenID}, nil
	}
	return nil, fmt.Errorf("claim caller id %s: its claim kept changing", cl.CallerID)
}

// Refresh extends the claim, only if it is still the one the lease wrote;
// [ErrClaimLost] otherwise.
func (l *CallerLease) Refresh(ctx context.Context) error {
	ack, err := l.c.js.Publish(ctx, "$KV."+BucketCallers+"."+l.key, l.data,
		jetstream.WithMsgTTL(l.c.ttl), jetstream.WithExpectLastSequencePerSubject(l.rev))
	if err != nil {
		if wrongSequence(err) {
			return ErrClaimLost
		}
		return fmt.Errorf("refresh claim %s: %w", l.key, err)
	}
	l.rev = ack.Sequence
	return nil
}

// Release removes the claim, only if it is still the one the lease wrote:
// a newer listen's claim is never removed.
func (l *CallerLease) Release(ctx context.Context) error {
	err := l.c.kv.Purge(ctx, l.key, jetstream.LastRevision(l.rev), jetstream.PurgeTTL(l.c.ttl))
	if err != nil {
		if wrongSequence(err) {
			return nil // a newer claim; not ours to remove
		}
		return fmt.Errorf("release claim %s: %w", l.key, err)
	}
	return nil
}

// ClaimOf returns the claim on a caller id of a tenant, nil when it is
// free.
func (c *Callers) ClaimOf(ctx context.Context, tenant, callerID string) (*CallerClaim, error) {
	e, err := c.kv.Get(ctx, ClaimKey(tenant, callerID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read claim of caller id %s: %w", callerID, err)
	}
	var cl CallerClaim
	if err := json.Unmarshal(e.Value(), &cl); err != nil {
		return nil, fmt.Errorf("read claim of caller id %s: %w", callerID, err)
	}
	return &cl, nil
}
