package bus

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A bucket is followed without a JetStream consumer: okso's buckets
// republish every message they store on okso.v1.state.<bucket>.<key>
// (their RePublish), and a follower reads the present state with direct
// gets, then applies the republished messages. Creating a consumer would
// let a client have JetStream deliver a bucket's messages to any subject
// it names; a direct get's answer can be sent elsewhere too, but where
// okso's roles are kept apart (DESIGN.md §6) only within the follower's
// own account, where no bucket is.

// stateSubject is the subject on which bucket's messages of key (">":
// every key) are republished.
func stateSubject(bucket, key string) string { return subjectPrefix + "state." + bucket + "." + key }

// rePublish is the RePublish of a bucket: every message, on its state
// subject.
func rePublish(bucket string) *jetstream.RePublish {
	return &jetstream.RePublish{Source: "$KV." + bucket + ".>", Destination: stateSubject(bucket, ">")}
}

// followResync bounds how long a follower trusts the republished messages
// alone: it reads the bucket's state again this often, in case NATS lost
// one (republishing is at most once).
const followResync = 5 * time.Minute

// directBatch is how many messages a direct get answers at once.
const directBatch = 256

// kvEntry is a key's last message, as a follower knows it.
type kvEntry struct {
	seq   uint64
	value []byte // nil: the key was deleted; a follower keeps it empty
	// expired: the key went away because its TTL ran out (a lease that
	// lapsed), not because it was deleted or purged.
	expired bool
	// ttl: the message has a TTL of its own (read by readState only).
	ttl bool
	at  time.Time // when JetStream stored the message
}

// kvChange is one change a follower reports: a key's value, or its going
// away (value nil), and whether it expired.
type kvChange struct {
	key     string
	value   []byte
	seq     uint64    // of the message that made the change (0: unknown)
	initial bool      // part of the initial state
	expired bool      // gone because its TTL ran out
	at      time.Time // when JetStream stored the message (zero: unknown)
}

// follower keeps the state of one key of a bucket, or of all its keys.
type follower struct {
	nc     *nats.Conn
	bucket string
	key    string // ">": every key
	fn     func(kvChange)
	state  map[string]kvEntry
}

// follow calls fn for every key of bucket present (all keys, or key
// alone), then calls ready once, then calls fn for every change (a nil
// value: the key went away), until ctx is done. It returns ctx's error,
// or the follower's if it fails. fn and ready run on follow's goroutine;
// fn must not keep value after it returns. A message lost by NATS (the
// connection was lost, the follower fell behind, a key's message came
// after one it never saw) makes the follower read the bucket again and
// report what changed meanwhile.
func follow(ctx context.Context, nc *nats.Conn, bucket, key string, fn func(kvChange), ready func()) error {
	if key == "" {
		key = ">"
	}
	f := &follower{nc: nc, bucket: bucket, key: key, fn: fn}
	live, err := nc.SubscribeSync(stateSubject(bucket, key))
	if err != nil {
		return fmt.Errorf("follow kv %s: %w", bucket, err)
	}
	defer func() { _ = live.Unsubscribe() }()
	if err := live.SetPendingLimits(-1, 256<<20); err != nil {
		return fmt.Errorf("follow kv %s: %w", bucket, err)
	}
	reconnected := nc.StatusChanged(nats.CONNECTED)
	defer nc.RemoveStatusListener(reconnected)
	// The subscription is on the server before the state is read: no
	// change falls between them.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return fmt.Errorf("follow kv %s: %w", bucket, err)
	}
	if err := f.resync(ctx, true); err != nil {
		return err
	}
	if ready != nil {
		ready()
	}
	resync := time.NewTicker(followResync)
	defer resync.Stop()
	msgs := make(chan *nats.Msg)
	errc := make(chan error, 1)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			m, err := live.NextMsgWithContext(rctx)
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-rctx.Done():
				return
			}
		}
	}()
	var (
		dropped int
		last    = time.Now()     // of the last reading of the state
		later   <-chan time.Time // a reading put off
	)
	for {
		var again bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("follow kv %s: %w", bucket, err)
		case <-reconnected:
			again = true
		case <-resync.C:
			again = true
		case <-later:
			later, again = nil, true
		case m := <-msgs:
			if lost := f.apply(m); lost != "" {
				// Read the key again; and, as NATS lost a message, the
				// rest in a while (others' may be lost too).
				if err := f.resyncKey(ctx, lost); err != nil {
					return err
				}
				again = true
			}
		}
		if n, _ := live.Dropped(); n != dropped {
			dropped, again = n, true
		}
		if !again {
			continue
		}
		// At most one reading of the state a second: the messages that
		// ask for more meanwhile ask for one.
		if wait := time.Until(last.Add(followMinResync)); wait > 0 {
			if later == nil {
				later = time.After(wait)
			}
			continue
		}
		if err := f.resync(ctx, false); err != nil {
			return err
		}
		last = time.Now()
	}
}

// followMinResync is the least time between two readings of a bucket's
// state by one follower.
const followMinResync = time.Second

// apply applies a republished message; it returns the key of a message
// lost before it, whose state must be read again ("" when none).
func (f *follower) apply(m *nats.Msg) (lost string) {
	key, seq, last, value, expired, ok := republished(f.bucket, m)
	if !ok || f.key != ">" && key != f.key {
		return "" // no message of the bucket's, or of another key
	}
	known := f.state[key]
	if seq <= known.seq {
		return "" // already read
	}
	// A message of the key came between the last one the follower saw and
	// this one: NATS lost one, and may have lost others', of other keys.
	// (Unless the follower saw the key go, and its marker has expired
	// since.)
	if last != known.seq && !(last == 0 && known.value == nil) {
		return key
	}
	f.set(key, kvEntry{seq: seq, value: value, expired: expired, at: storedAt(m)}, false)
	return ""
}

// resyncKey reads key's state again and reports its change, if any.
func (f *follower) resyncKey(ctx context.Context, key string) error {
	now, err := readState(ctx, f.nc, f.bucket, key)
	if err != nil {
		return err
	}
	e, ok := now[key]
	switch {
	case ok && e.seq > f.state[key].seq:
		f.set(key, e, false)
	case !ok && f.state[key].value != nil:
		f.set(key, kvEntry{}, false) // gone altogether, marker included
	}
	return nil
}

// set records key's new message and reports the change.
func (f *follower) set(key string, e kvEntry, initial bool) {
	was := f.state[key].value
	value := e.value
	if value != nil {
		// Only whether the key has a value is kept (fn does not keep it
		// either): a follower of every node's record would otherwise hold
		// each record's bytes a second time.
		e.value = []byte{}
	}
	f.state[key] = e
	switch {
	case value != nil:
		f.fn(kvChange{key: key, value: value, seq: e.seq, initial: initial, at: e.at})
	case was != nil && !initial:
		f.fn(kvChange{key: key, seq: e.seq, expired: e.expired, at: e.at})
	}
}

// resync reads the bucket's state and reports what differs from what the
// follower knew (everything, the first time).
func (f *follower) resync(ctx context.Context, initial bool) error {
	now, err := readState(ctx, f.nc, f.bucket, f.key)
	if err != nil {
		return err
	}
	old := f.state
	f.state = make(map[string]kvEntry, len(now))
	for key, e := range now {
		if o, ok := old[key]; ok && o.seq == e.seq {
			f.state[key] = o
			continue
		}
		f.state[key] = kvEntry{seq: old[key].seq, value: old[key].value}
		f.set(key, e, initial)
	}
	for key, o := range old {
		if _, ok := now[key]; !ok && o.value != nil {
			f.fn(kvChange{key: key}) // gone altogether, markers included
		}
	}
	return nil
}

// readState reads the last message of each key of bucket (">": every
// key) with direct gets, a page at a time.
func readState(ctx context.Context, nc *nats.Conn, bucket, key string) (map[string]kvEntry, error) {
	// An inbox no one can guess: the answers a follower takes from it are
	// its state.
	inbox := nc.NewInbox() + "." + rand.Text()
	// A page at a time, each read to its end before the next is asked
	// for: a channel of one page's answers never fills. (A sync
	// subscription's has room for nats.go's 65,536 by default: 512 KiB
	// allocated per read, which a tier does for every node that connects.)
	page := make(chan *nats.Msg, directBatch+2)
	sub, err := nc.ChanSubscribe(inbox, page)
	if err != nil {
		return nil, fmt.Errorf("read kv %s: %w", bucket, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	state := map[string]kvEntry{}
	subject := "$KV." + bucket + "." + key
	for seq := uint64(1); ; {
		req, _ := json.Marshal(struct {
			Seq   uint64 `json:"seq"`
			Next  string `json:"next_by_subj"`
			Batch int    `json:"batch"`
		}{seq, subject, directBatch})
		if err := nc.PublishRequest(jsAPI+"DIRECT.GET."+kvStream(bucket), inbox, req); err != nil {
			return nil, fmt.Errorf("read kv %s: %w", bucket, err)
		}
		more, next, err := readPage(ctx, page, bucket, state)
		if err != nil {
			return nil, err
		}
		if !more {
			return state, nil
		}
		seq = next
	}
}

// readPage reads the answers to one direct get, into state: more says
// whether messages remain after them, from sequence next.
func readPage(ctx context.Context, page <-chan *nats.Msg, bucket string, state map[string]kvEntry) (more bool, next uint64, _ error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		var m *nats.Msg
		select {
		case m = <-page:
		case <-ctx.Done():
			return false, 0, fmt.Errorf("read kv %s: %w", bucket, ctx.Err())
		}
		status := ""
		if !FromJetStream(m) { // a stored message's own Status header is data
			status = m.Header.Get("Status")
		}
		switch status {
		case "":
		case "404": // nothing (more) to read
			return false, 0, nil
		case "204": // the end of this page
			pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			return pending > 0, next, nil
		case "503":
			return false, 0, fmt.Errorf("read kv %s: %w", bucket, jetstream.ErrJetStreamNotEnabled)
		default:
			return false, 0, fmt.Errorf("read kv %s: direct get: %s %s", bucket, status, m.Header.Get("Description"))
		}
		key, seq, _, value, expired, ok := republished(bucket, m)
		if !ok {
			continue
		}
		if e, ok := state[key]; !ok || seq > e.seq {
			state[key] = kvEntry{seq: seq, value: value, expired: expired, at: storedAt(m),
				ttl: value != nil && m.Header.Get(jetstream.MsgTTLHeader) != ""}
		}
		next = seq + 1
	}
}

// republished decodes a message of bucket as republished or answered by
// a direct get: its key, sequence, the sequence of its key's message
// before it (republished only), and its value (nil: a deletion, a purge
// or an expiry marker; expired: the last).
//
// JetStream adds its headers after the stored message's own, so the last
// of each is JetStream's: a message stored with headers of those names,
// then answered by a direct get onto a bucket's state subject, is told
// apart by them (its stream is another, or its key is its own).
func republished(bucket string, m *nats.Msg) (key string, seq, last uint64, value []byte, expired, ok bool) {
	if lastHeader(m, jetstream.StreamHeader) != kvStream(bucket) {
		return "", 0, 0, nil, false, false
	}
	key, ok = strings.CutPrefix(lastHeader(m, jetstream.SubjectHeader), "$KV."+bucket+".")
	if !ok || key == "" {
		return "", 0, 0, nil, false, false
	}
	// A copy: the header's value shares one string with the message's
	// whole header block, which followers' maps would keep per key.
	key = strings.Clone(key)
	seq, err := strconv.ParseUint(lastHeader(m, jetstream.SequenceHeader), 10, 64)
	if err != nil || seq == 0 {
		return "", 0, 0, nil, false, false
	}
	last, _ = strconv.ParseUint(lastHeader(m, "Nats-Last-Sequence"), 10, 64)
	switch reason := m.Header.Get(jetstream.MarkerReasonHeader); {
	case reason != "":
		return key, seq, last, nil, reason == markerMaxAge, true
	case m.Header.Get("KV-Operation") != "":
		return key, seq, last, nil, false, true
	}
	value = m.Data
	if value == nil {
		value = []byte{}
	}
	return key, seq, last, value, false, true
}

// storedAt is when JetStream stored m, as a republished message or a
// direct get's answer says (zero when it does not).
func storedAt(m *nats.Msg) time.Time {
	at, _ := time.Parse(time.RFC3339Nano, lastHeader(m, jetstream.TimeStampHeaer))
	return at
}

// markerMaxAge is the reason JetStream gives in the marker it writes when
// a key's TTL runs out.
const markerMaxAge = "MaxAge"

// lastHeader is the last value of m's header key ("" when none).
func lastHeader(m *nats.Msg, key string) string {
	if v := m.Header.Values(key); len(v) > 0 {
		return v[len(v)-1]
	}
	return ""
}
