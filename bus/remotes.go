package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketRemotes is the JetStream KV bucket of federated upstreams, keyed
// by upstream name (DESIGN.md §4, §9.1).
const BucketRemotes = "okso_remotes"

// QueueRemote is the queue group of the upstreams' call subjects: the
// replicas of the remote tier share each upstream's calls.
const QueueRemote = "remote"

// RemoteCall is the request/reply subject of one upstream's calls.
func RemoteCall(upstream string) string { return subjectPrefix + "remote." + upstream + ".call" }

// Remote is the record of one healthy upstream, written by the remote
// tier replicas that can list it: who may see its tools, and the allowed
// tools with their schemas and safety classes.
type Remote struct {
	Upstream  string   `json:"upstream"`
	Transport string   `json:"transport"`
	Tenants   []string `json:"tenants"` // "*": every tenant
	TimeoutMs int64    `json:"timeout_ms"`
	// Digest identifies the tool list (see [Remote.Seal]): two replicas
	// that list the same tools write the same record, and a watcher sees
	// a refresh as no change.
	Digest string       `json:"digest"`
	Tools  []RemoteTool `json:"tools"` // sorted by Name
}

// RemoteTool is one allowed tool of an upstream, as the upstream lists it
// and the remote tier's config classes it.
type RemoteTool struct {
	Name         string          `json:"name"` // the upstream's own name, not projected
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"input_schema"`
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	Safety       string          `json:"safety"`
	Idempotent   bool            `json:"idempotent,omitempty"`
}

// Seal sorts the record's tools by name and sets its digest, the SHA-256
// of the tools as JSON.
func (r *Remote) Seal() error {
	slices.SortFunc(r.Tools, func(a, b RemoteTool) int { return strings.Compare(a.Name, b.Name) })
	b, err := json.Marshal(r.Tools)
	if err != nil {
		return fmt.Errorf("seal upstream %s: %w", r.Upstream, err)
	}
	sum := sha256.Sum256(b)
	r.Digest = hex.EncodeToString(sum[:])
	return nil
}

// RemotesOptions configures the bucket. The zero value keeps it in
// memory, on one replica, with a 15 s lease.
type RemotesOptions struct {
	// TTL is how long a record outlives the last Put of any replica.
	TTL      time.Duration
	Replicas int
	File     bool // file storage instead of memory
}

// Remotes is the upstream registry (KV okso_remotes). It is safe for
// concurrent use.
//
// Every replica of the remote tier that can list an upstream writes its
// record, so a key has several writers: [Remotes.Put] is unconditional
// (the records are alike; the last one refreshes the lease for all), and
// [Remotes.Release] removes the record only if no replica wrote it since
// the revision the releasing one wrote.
type Remotes struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	ttl time.Duration
}

// OpenRemotes creates the bucket, or binds to it when it exists.
func OpenRemotes(ctx context.Context, nc *nats.Conn, opts RemotesOptions) (*Remotes, error) {
	if opts.TTL == 0 {
		opts.TTL = 15 * time.Second
	}
	if opts.TTL < time.Second {
		return nil, fmt.Errorf("remotes lease %v: NATS message TTLs count whole seconds, use at least 1s", opts.TTL)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	kv, err := openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:         BucketRemotes,
		Description:    "okso federated upstreams",
		History:        1,
		Replicas:       max(opts.Replicas, 1),
		LimitMarkerTTL: opts.TTL,
	}, opts.File)
	if err != nil {
		return nil, err
	}
	return &Remotes{kv: kv, js: js, ttl: opts.TTL}, nil
}

// openKV binds to a bucket when it exists, so that one process's options
// never rewrite another's; the first process creates it.
func openKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, file bool) (jetstream.KeyValue, error) {
	if kv, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
		return kv, nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, err)
	}
	cfg.Storage = jetstream.MemoryStorage
	if file {
		cfg.Storage = jetstream.FileStorage
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// TTL returns the lease duration; a writer puts again well within it.
func (r *Remotes) TTL() time.Duration { return r.ttl }

// Put writes an upstream's record with the lease's TTL, whoever wrote it
// last, and returns its revision.
func (r *Remotes) Put(ctx context.Context, rec *Remote) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	ack, err := r.js.Publish(ctx, "$KV."+BucketRemotes+"."+rec.Upstream, data, jetstream.WithMsgTTL(r.ttl))
	if err != nil {
		return 0, fmt.Errorf("put upstream %s: %w", rec.Upstream, err)
	}
	return ack.Sequence, nil
}

// Release removes an upstream's record, only if it is still the one
// written at rev: a record another replica wrote since is kept.
func (r *Remotes) Release(ctx context.Context, upstream string, rev uint64) error {
	err := r.kv.Purge(ctx, upstream, jetstream.LastRevision(rev), jetstream.PurgeTTL(r.ttl))
	if err != nil {
		if wrongSequence(err) {
			return nil // another replica's record; not ours to remove
		}
		return fmt.Errorf("release upstream %s: %w", upstream, err)
	}
	return nil
}

// RemoteEvent is one change of the bucket seen by [Remotes.Watch].
type RemoteEvent struct {
	Upstream string
	Remote   *Remote // nil when the upstream went away
	Initial  bool    // part of the initial state
}

// Watch calls fn for every record present, then calls ready once, then
// calls fn for every change, until ctx is done. It returns ctx's error, or
// the watch's if it fails. A record that is no upstream okso wrote (it
// does not decode, or names another upstream) is reported as gone. fn and
// ready run on Watch's goroutine.
func (r *Remotes) Watch(ctx context.Context, fn func(RemoteEvent), ready func()) error {
	return watchKV(ctx, r.kv, func(key string, value []byte, initial bool) {
		ev := RemoteEvent{Upstream: key, Initial: initial}
		if value != nil {
			var rec Remote
			if json.Unmarshal(value, &rec) == nil && rec.Upstream == key {
				ev.Remote = &rec
			}
		}
		if ev.Remote == nil && initial {
			return
		}
		fn(ev)
	}, ready)
}
