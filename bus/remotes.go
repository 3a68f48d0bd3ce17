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
	// Writer names the replica of the remote tier that wrote the record
	// (the one started last, of the replicas that wrote it alike), and
	// WriterStarted when that replica started: of two replicas that list
	// the upstream differently, the one started last keeps the record
	// (see [Remotes.Put]). Both are empty in a record written by another
	// process, which any replica may replace.
	Writer        string    `json:"writer,omitempty"`
	WriterStarted time.Time `json:"writer_started,omitzero"`
}

// SameListing reports whether r and o list the same tools to the same
// tenants the same way: a gateway sees no change from one to the other.
func (r *Remote) SameListing(o *Remote) bool {
	return r.Digest != "" && r.Digest == o.Digest && r.TimeoutMs == o.TimeoutMs &&
		r.Transport == o.Transport && slices.Equal(r.Tenants, o.Tenants)
}

// startedAfter reports whether r's writer started after o's (the
// writers' names break a tie).
func (r *Remote) startedAfter(o *Remote) bool {
	if c := r.WriterStarted.Compare(o.WriterStarted); c != 0 {
		return c > 0
	}
	return r.Writer > o.Writer
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
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// Remotes is the upstream registry (KV okso_remotes). It is safe for
// concurrent use.
//
// Every replica of the remote tier that can list an upstream writes its
// record, so a key has several writers. Replicas that list it alike take
// turns ([Remotes.Put]: the last one refreshes the lease for all); when
// they differ (a config being rolled out), the record is the one of the
// replica started last, and the others leave it alone. [Remotes.Release]
// removes the record only if no replica wrote it since the revision the
// releasing one wrote.
type Remotes struct {
	kv     jetstream.KeyValue
	js     jetstream.JetStream
	stream jetstream.Stream // the bucket's, for a key's last message
	ttl    time.Duration
}

// OpenRemotes creates the bucket, or binds to it when it exists.
func OpenRemotes(ctx context.Context, nc *nats.Conn, opts RemotesOptions) (*Remotes, error) {
	js, kv, ttl, err := openLeased(ctx, nc, BucketRemotes, "okso federated upstreams", opts.TTL, opts.Replicas, opts.File, opts.BindOnly)
	if err != nil {
		return nil, err
	}
	opts.TTL = ttl
	stream, err := js.Stream(ctx, kvStream(BucketRemotes))
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", BucketRemotes, err)
	}
	return &Remotes{kv: kv, js: js, stream: stream, ttl: opts.TTL}, nil
}

// openLeased opens a bucket of leased records: one History, a
// LimitMarkerTTL (for per-key TTLs and for watchers to see expiries) of
// ttl, 15 s when 0. NATS message TTLs count whole seconds.
func openLeased(ctx context.Context, nc *nats.Conn, bucket, desc string, ttl time.Duration, replicas int, file, bindOnly bool) (jetstream.JetStream, jetstream.KeyValue, time.Duration, error) {
	if ttl == 0 {
		ttl = 15 * time.Second
	}
	if ttl < time.Second {
		return nil, nil, 0, fmt.Errorf("%s lease %v: NATS message TTLs count whole seconds, use at least 1s", bucket, ttl)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("open jetstream: %w", err)
	}
	kv, err := openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:         bucket,
		Description:    desc,
		History:        1,
		Storage:        storage(file),
		Replicas:       max(replicas, 1),
		LimitMarkerTTL: ttl,
	}, bindOnly)
	if err != nil {
		return nil, nil, 0, err
	}
	return js, kv, ttl, nil
}

// kvStream is the name of the stream that holds a KV bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// openKV binds to a bucket when it exists, so that one process's options
// never rewrite another's; the first process creates it (unless
// bindOnly). It updates a bucket only to give it the RePublish okso's
// followers need (one an older okso made): a role's NATS credential
// may do neither (DESIGN.md §6), so a bucket it binds to must be
// ready, made by okso nats init or by the okso process that embeds
// NATS.
func openKV(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, bindOnly bool) (jetstream.KeyValue, error) {
	cfg.RePublish = rePublish(cfg.Bucket)
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		if bindOnly {
			return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, ErrNoBucket)
		}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) { // another process made it meanwhile
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, err)
	}
	have := st.Config()
	if rp := have.RePublish; rp != nil && *rp == *cfg.RePublish {
		return kv, nil
	}
	if bindOnly {
		return nil, fmt.Errorf("open kv %s: %w", cfg.Bucket, ErrOldBucket)
	}
	have.RePublish = cfg.RePublish
	if kv, err = js.UpdateKeyValue(ctx, have); err != nil {
		return nil, fmt.Errorf("open kv %s: give it the republishing okso follows it by: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// ErrNoBucket is returned, wrapped, when a bucket of okso's that a role
// may not create does not exist.
var ErrNoBucket = errors.New("it does not exist on this NATS (okso nats init makes okso's buckets, with the admin's NATS credential)")

// ErrOldBucket is returned, wrapped, when a bucket of okso's that a role
// may not change lacks what this okso needs of it.
var ErrOldBucket = errors.New("an older okso made it (okso nats init updates okso's buckets, with the admin's NATS credential)")

// storage is file storage, or else memory storage.
func storage(file bool) jetstream.StorageType {
	if file {
		return jetstream.FileStorage
	}
	return jetstream.MemoryStorage
}

// TTL returns the lease duration; a writer puts again well within it.
func (r *Remotes) TTL() time.Duration { return r.ttl }

// ErrNewerReplica is returned, wrapped, by [Remotes.Put] when the
// upstream's record lists it otherwise than the record to write, and was
// written by a replica started after the writer of the one to write.
var ErrNewerReplica = errors.New("a newer replica's record lists the upstream differently")

// putTries bounds the writes of one Put that lose a race with another
// replica's.
const putTries = 3

// Put writes an upstream's record with the lease's TTL and returns its
// revision, unless the live record lists the upstream differently and
// its writer started after rec's: then it writes nothing and returns an
// error wrapping [ErrNewerReplica], so that two replicas with different
// configs do not replace each other's record on every refresh. Records
// that list the upstream alike replace each other, whoever wrote them,
// and keep the name of the newest writer. The write is conditional on
// the record read, so a record written meanwhile is judged in turn.
func (r *Remotes) Put(ctx context.Context, rec *Remote) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	subject := "$KV." + BucketRemotes + "." + rec.Upstream
	for try := 1; ; try++ {
		live, last, err := r.last(ctx, subject, rec.Upstream)
		if err != nil {
			return 0, fmt.Errorf("put upstream %s: %w", rec.Upstream, err)
		}
		out := data
		if live != nil && live.startedAfter(rec) {
			if !live.SameListing(rec) {
				return 0, fmt.Errorf("put upstream %s: %w (replica %s)", rec.Upstream, ErrNewerReplica, live.Writer)
			}
			// Alike: the record keeps naming the newer replica, so that
			// one started between the two that lists the upstream
			// otherwise still leaves it alone.
			alike := *rec
			alike.Writer, alike.WriterStarted = live.Writer, live.WriterStarted
			if out, err = json.Marshal(&alike); err != nil {
				return 0, err
			}
		}
		ack, err := r.js.Publish(ctx, subject, out, jetstream.WithMsgTTL(r.ttl), jetstream.WithExpectLastSequencePerSubject(last))
		if err == nil {
			return ack.Sequence, nil
		}
		if !wrongSequence(err) || try == putTries {
			return 0, fmt.Errorf("put upstream %s: %w", rec.Upstream, err)
		}
	}
}

// kvOperation is the header of a KV removal marker.
const kvOperation = "KV-Operation"

// last returns the live record of upstream, if any, and the sequence of
// the last message of its key (0: none; a removal or expiry marker
// counts). A value that is no record of upstream is none.
func (r *Remotes) last(ctx context.Context, subject, upstream string) (*Remote, uint64, error) {
	m, err := r.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if m.Header.Get(kvOperation) != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil, m.Sequence, nil
	}
	var rec Remote
	if json.Unmarshal(m.Data, &rec) != nil || rec.Upstream != upstream {
		return nil, m.Sequence, nil
	}
	return &rec, m.Sequence, nil
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
	// Expired: the record went away because its lease ran out (no remote
	// tier refreshed it), not because a remote tier removed it.
	Expired bool
	// Invalid: a record is there, but none okso wrote (it does not
	// decode, or names another upstream).
	Invalid bool
}

// Watch calls fn for every record present, then calls ready once, then
// calls fn for every change, until ctx is done. It returns ctx's error, or
// the watch's if it fails. A record that is no upstream okso wrote (it
// does not decode, or names another upstream) is reported as gone. fn and
// ready run on Watch's goroutine.
func (r *Remotes) Watch(ctx context.Context, fn func(RemoteEvent), ready func()) error {
	return r.watch(ctx, "", fn, ready)
}

// WatchUpstream is [Remotes.Watch] of one upstream's record.
func (r *Remotes) WatchUpstream(ctx context.Context, upstream string, fn func(RemoteEvent), ready func()) error {
	return r.watch(ctx, upstream, fn, ready)
}

func (r *Remotes) watch(ctx context.Context, key string, fn func(RemoteEvent), ready func()) error {
	return follow(ctx, r.js.Conn(), BucketRemotes, key, func(c kvChange) {
		ev := RemoteEvent{Upstream: c.key, Initial: c.initial, Expired: c.expired}
		if c.value != nil {
			var rec Remote
			if json.Unmarshal(c.value, &rec) == nil && rec.Upstream == c.key {
				ev.Remote = &rec
			} else {
				ev.Invalid = true
			}
		}
		if ev.Remote == nil && c.initial {
			return
		}
		fn(ev)
	}, ready)
}
