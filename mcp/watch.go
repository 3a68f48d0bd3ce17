package mcp

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// A source follows one bucket (okso_nodes, okso_remotes, okso_callers)
// with a watcher: one watch reads the bucket's present state and then
// its changes (bus follows it: updates, deletions, leases that lapse);
// when a watch's present state is in, what the source knew but the
// bucket no longer has is swept out. A watch that fails is started again
// a second later, and a watch is started afresh on resync (the NATS
// connection came back), so that the source reconciles with what
// changed meanwhile.

// watchFunc runs one watch of a bucket: it applies every change to the
// source, calls seen with the key of each record of the present state,
// then ready once, until ctx ends. It returns ctx's error or its own.
type watchFunc func(ctx context.Context, seen func(key string), ready func()) error

// watcher keeps one source's watch of its bucket running. Make it with
// newWatcher; run it once. kick and synced are safe for concurrent use.
type watcher struct {
	what   string    // what it follows, for the log
	watch  watchFunc // one watch
	known  func() []string
	vanish func(key string)

	resync chan struct{} // a fresh watch is wanted
	synced chan struct{} // closed once the first present state is in and swept
	once   sync.Once
}

// newWatcher returns a watcher of a source: watch runs one watch, known
// returns the keys the source holds, and vanish forgets one of them,
// found gone from the bucket by a fresh watch.
func newWatcher(what string, watch watchFunc, known func() []string, vanish func(key string)) *watcher {
	return &watcher{what: what, watch: watch, known: known, vanish: vanish,
		resync: make(chan struct{}, 1), synced: make(chan struct{})}
}

// kick asks for a fresh watch.
func (w *watcher) kick() {
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

// isSynced reports whether the first present state is in.
func (w *watcher) isSynced() bool {
	select {
	case <-w.synced:
		return true
	default:
		return false
	}
}

// run keeps a watch running until ctx ends: again a second after it
// fails, and afresh on every kick. It returns when ctx ends, after the
// watch it started ended.
func (w *watcher) run(ctx context.Context, log *slog.Logger) {
	for {
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.watchOnce(wctx) }()
		var err error
		select {
		case err = <-done:
		case <-w.resync:
			cancel()
			<-done
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Warn(w.what+" watch ended; watching again", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// watchOnce runs one watch; when its present state is in, the keys the
// source knew but the state lacks vanish.
func (w *watcher) watchOnce(ctx context.Context) error {
	seen := map[string]bool{}
	return w.watch(ctx, func(key string) { seen[key] = true }, func() {
		for _, key := range w.known() {
			if !seen[key] {
				w.vanish(key)
			}
		}
		w.once.Do(func() { close(w.synced) })
	})
}
