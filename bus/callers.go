package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketCallers is the JetStream KV bucket of the callers' tool
// declarations, keyed by listen id (DESIGN.md §4, §9.3).
const BucketCallers = "okso_callers"

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
// concurrent use. Each key has one writer, the replica holding the listen.
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
}

// Watch calls fn for every declaration present, then ready once, then fn
// for every change, until ctx is done. A record that does not decode, or
// names another listen, is reported as gone.
func (c *Callers) Watch(ctx context.Context, fn func(CallerEvent), ready func()) error {
	return watchKV(ctx, c.js, BucketCallers, func(key string, value []byte, initial bool) {
		ev := CallerEvent{ListenID: key, Initial: initial}
		if value != nil {
			var rec Caller
			if json.Unmarshal(value, &rec) == nil && rec.ListenID == key {
				ev.Caller = &rec
			}
		}
		if ev.Caller == nil && initial {
			return
		}
		fn(ev)
	}, ready)
}
