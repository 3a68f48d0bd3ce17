package bus

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// testBucket starts a server and makes bucket there as okso makes its
// own; all of it ends with the test.
func testBucket(t *testing.T, bucket string) (context.Context, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	srv, err := StartServer(ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := openKV(ctx, js, jetstream.KeyValueConfig{Bucket: bucket, History: 1}, false); err != nil {
		t.Fatal(err)
	}
	return ctx, nc, js
}

// change is one call of a follower's fn.
type change struct {
	key, value string // value "": gone
	initial    bool
}

// TestFollowerResync: a follower that lost messages (it was disconnected,
// it fell behind) reads the bucket again and reports exactly what changed
// since: keys put, changed and gone, past ones it saw only as a page of
// direct gets (more than one page of them); and a republished message
// that does not follow the last one it saw of its key asks for that.
func TestFollowerResync(t *testing.T) {
	ctx, nc, js := testBucket(t, "test_follow")
	kv, err := js.KeyValue(ctx, "test_follow")
	if err != nil {
		t.Fatal(err)
	}
	n := directBatch + 10 // more than a page
	for i := range n {
		if _, err := kv.Put(ctx, "k"+strconv.Itoa(i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	var got []change
	f := &follower{nc: nc, bucket: "test_follow", key: ">", fn: func(c kvChange) {
		key, value, initial := c.key, c.value, c.initial
		got = append(got, change{key, string(value), initial})
	}}
	if err := f.resync(ctx, true); err != nil {
		t.Fatal(err)
	}
	if len(got) != n || !got[0].initial {
		t.Fatalf("initial state: %d changes (%v...), want %d initial puts", len(got), got[:min(3, len(got))], n)
	}

	// Meanwhile, unseen: k0 changes, k1 is deleted, k2 purged, new appears.
	got = nil
	if _, err := kv.Put(ctx, "k0", []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, "k1"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "new", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := f.resync(ctx, false); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b change) int { return strings.Compare(a.key, b.key) })
	want := []change{{"k0", "v2", false}, {"k1", "", false}, {"k2", "", false}, {"new", "v", false}}
	if !slices.Equal(got, want) {
		t.Fatalf("after a resync: %v, want %v", got, want)
	}

	// A republished message of k0 that follows the one the follower saw
	// is applied; one that follows another it never saw is not.
	e, err := kv.Get(ctx, "k0")
	if err != nil {
		t.Fatal(err)
	}
	msg := func(seq, last uint64, value string) *nats.Msg {
		m := nats.NewMsg(stateSubject("test_follow", "k0"))
		m.Header.Set(jetstream.StreamHeader, "KV_test_follow")
		m.Header.Set(jetstream.SubjectHeader, "$KV.test_follow.k0")
		m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
		m.Header.Set("Nats-Last-Sequence", strconv.FormatUint(last, 10))
		m.Data = []byte(value)
		return m
	}
	got = nil
	if lost := f.apply(msg(e.Revision()+5, e.Revision(), "v3")); lost != "" || len(got) != 1 || got[0].value != "v3" {
		t.Fatalf("the next message of k0: %v (lost %q)", got, lost)
	}
	if lost := f.apply(msg(e.Revision()+9, e.Revision()+7, "v4")); lost != "k0" || len(got) != 1 {
		t.Fatalf("a message after one the follower never saw: applied %v, lost %q", got, lost)
	}
	if lost := f.apply(msg(e.Revision()+5, e.Revision(), "v3")); lost != "" || len(got) != 1 {
		t.Fatalf("a message seen already was applied again: %v", got)
	}
	// Reading k0 again finds it as the bucket has it (v2, an older
	// sequence than the made-up ones): nothing to report.
	if err := f.resyncKey(ctx, "k0"); err != nil || len(got) != 1 {
		t.Fatalf("k0 read again: %v, %v", got, err)
	}

	// A message another stream's JetStream sent (a direct get answered
	// onto the state subject), with a stored message's own headers that
	// claim this bucket's key before JetStream's: not the bucket's.
	forged := msg(e.Revision()+6, e.Revision()+5, "")
	forged.Header = nats.Header{
		jetstream.StreamHeader:   {"KV_test_follow", "KV_other"},
		jetstream.SubjectHeader:  {"$KV.test_follow.k0", "$KV.other.trap"},
		jetstream.SequenceHeader: {strconv.FormatUint(e.Revision()+6, 10), "1"},
		"KV-Operation":           {"DEL"},
	}
	if lost := f.apply(forged); lost != "" || len(got) != 1 || f.state["k0"].value == nil {
		t.Fatalf("another stream's message was applied: %v", got)
	}

	// A follower of one key takes no other key's message.
	one := &follower{nc: nc, bucket: "test_follow", key: "k3", state: map[string]kvEntry{}, fn: f.fn}
	if lost := one.apply(msg(e.Revision()+20, 0, "v9")); lost != "" || len(got) != 1 {
		t.Fatalf("a follower of k3 took k0's message: %v", got)
	}
}

// TestFollowerStoredStatus: a stored message whose own headers look like
// a direct get's status (the end of a page, nothing found, an error) is
// data to a follower reading the state, not the end of its reading.
func TestFollowerStoredStatus(t *testing.T) {
	ctx, nc, js := testBucket(t, "test_status")
	for i, status := range []string{"404", "503", "204", ""} {
		m := nats.NewMsg("$KV.test_status.k" + strconv.Itoa(i))
		if status != "" {
			m.Header.Set("Status", status)
		}
		m.Data = []byte("v")
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	state, err := readState(ctx, nc, "test_status", ">")
	if err != nil {
		t.Fatalf("read the state: %v", err)
	}
	if len(state) != 4 {
		t.Fatalf("read %d keys, want 4: %v", len(state), state)
	}
}
