package mcp

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestWatcher: a watch's present state sweeps out what the source knew
// but the state lacks, and only then is the watcher synced; a kick starts
// a fresh watch, which sweeps again; run returns, its watch ended, once
// its context ends.
func TestWatcher(t *testing.T) {
	var mu sync.Mutex
	known := map[string]bool{"a": true, "b": true, "gone": true}
	states := make(chan []string)    // the present state of each watch
	vanished := make(chan string, 8) // what the sweeps forgot
	ended := make(chan struct{}, 8)  // a watch returned
	watch := func(ctx context.Context, seen func(string), ready func()) error {
		defer func() { ended <- struct{}{} }()
		select {
		case state := <-states:
			for _, key := range state {
				seen(key)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		ready()
		<-ctx.Done()
		return ctx.Err()
	}
	w := newWatcher("test", watch, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Sorted(maps.Keys(known))
	}, func(key string) {
		mu.Lock()
		delete(known, key)
		mu.Unlock()
		vanished <- key
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { w.run(ctx, slog.New(slog.DiscardHandler)); close(done) }()

	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never came", what)
		}
	}
	sweep := func(want string) {
		t.Helper()
		select {
		case got := <-vanished:
			if got != want {
				t.Fatalf("the sweep forgot %s, want %s", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the sweep never forgot %s", want)
		}
	}

	if w.isSynced() {
		t.Fatal("synced before any state came")
	}
	states <- []string{"a", "b"}
	sweep("gone")
	wait("synced", w.synced)

	w.kick() // as when NATS came back
	wait("the first watch's end", ended)
	states <- []string{"a"}
	sweep("b")

	cancel()
	wait("run's return", done)
	wait("the second watch's end", ended)
	select {
	case key := <-vanished:
		t.Errorf("%s forgot though the state had it", key)
	default:
	}
}
