package tier_test

import (
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/internal/tiertest"
	"github.com/okso-io/okso/device/tier"
)

// TestTierKilled: a tier that stops without a word (kill -9: it neither
// marks its nodes offline nor releases its lease) takes its nodes
// offline at every watch once its lease lapses, each last seen at the
// tier's last heartbeat; the surviving tier then marks their records
// offline, to expire after the offline retention.
func TestTierKilled(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	url, nc := leaseTier(t, tt, "tier-doomed", time.Second)
	events := tt.watch(t)
	nodes := map[string]bool{}
	var ids []string
	for range 2 {
		d := tt.runEchoAt(t, url)
		waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
		nodes[d.node] = true
		ids = append(ids, d.node)
	}
	started := time.Now()
	nc.Close() // the tier can no longer write anything, as if killed
	killed := time.Now()
	for len(nodes) > 0 {
		e := waitEvent(t, events, func(e bus.Event) bool { return nodes[e.NodeID] })
		if e.Node == nil || !e.Node.Offline() {
			t.Fatalf("node %s after its tier died: %+v, want offline", e.NodeID, e.Node)
		}
		if seen := e.Node.LastSeen; seen.Before(started.Add(-2*time.Second)) || seen.After(killed) {
			t.Errorf("node %s last seen %v, want the tier's last heartbeat, before %v", e.NodeID, seen, killed)
		}
		delete(nodes, e.NodeID)
	}
	for _, id := range ids {
		for r := tt.Record(t, id); !r.Offline(); r = tt.Record(t, id) {
			waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == id })
		}
	}
}

// TestNoWritePerNode: while a fleet idles, its tier writes its own lease
// every third of the TTL and nothing per node, however many lease
// periods go by.
func TestNoWritePerNode(t *testing.T) {
	tt := newTestTier(t, tier.Options{})
	url, _ := leaseTier(t, tt, "tier-idle", time.Second)
	events := tt.watch(t)
	for range 5 {
		d := tt.runEchoAt(t, url)
		waitEvent(t, events, func(e bus.Event) bool { return e.NodeID == d.node && e.Node != nil && !e.Node.Offline() })
	}
	records, err := tt.NC.SubscribeSync("okso.v1.state." + bus.BucketNodes + ".>")
	if err != nil {
		t.Fatal(err)
	}
	beats, err := tt.NC.SubscribeSync("okso.v1.state." + bus.BucketTiers + ".tier-idle")
	if err != nil {
		t.Fatal(err)
	}
	if err := tt.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 9 { // three lease periods
		if _, err := beats.NextMsg(tiertest.WaitFor); err != nil {
			t.Fatalf("the tier's heartbeat: %v", err)
		}
	}
	if n, _, _ := records.Pending(); n != 0 {
		t.Errorf("%d writes of node records over three idle lease periods, want none", n)
	}
	select {
	case e := <-events:
		t.Errorf("a watch saw a change of an idle fleet: %+v", e)
	default:
	}
}
