package mcp

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/schemas"
)

// A source is one kind of tools' owners: devices (devices.go), federated
// upstreams (upstreams.go), callers' own tools (callers.go). Each is one
// type with its own state and locks; it follows its bucket with a
// watcher (watch.go) and feeds the catalog through a feed, giving each
// entry it puts what it takes to invoke it (an invoker). The gateway
// runs every source it registered (New: one line each) and never asks
// which source an entry came from.

// source is what the gateway needs of a source to run it.
type source interface {
	// watcher follows the source's bucket.
	watcher() *watcher
	// settle returns once what the source's first state started (the
	// device source's probes) is done, or took too long, or ctx ended.
	settle(ctx context.Context)
	// wait waits for the goroutines the source started, once its watch
	// has ended.
	wait()
}

// feed is the catalog as a source feeds it: it puts its tools under keys
// of its own, drops them, says why tools left, and tells the gateway's
// waiters that what it holds changed. Safe for concurrent use.
type feed interface {
	put(key, tenant string, entries []*entry)
	drop(key string)
	// putNode and dropNode do for a node's tools, held by node rather
	// than by name, what put and drop do for a key's.
	putNode(n *nodeTool)
	dropNode(nodeID string)
	unlisted(source, reason string, attrs ...any)
	changed()
}

// shelf is the gateway's feed: the catalog, the count of unlistings, the
// waiters of [Gateway.Wait], and the count of the checks its entries ran
// against schemas okso did not write (upstreams' and caller tools'). Its
// own lock, mu, covers what the catalog's does not.
type shelf struct {
	*catalog
	log           *slog.Logger
	foreignChecks atomic.Int64

	mu         sync.Mutex
	unlistings map[string]int64 // "source/reason" → count
	change     chan struct{}    // closed and replaced on every change
}

// CatalogView is a read-only look at a gateway's catalog ([Gateway.Catalog]).
// It is safe for concurrent use.
type CatalogView struct{ s *shelf }

// Has reports whether a tenant's callers may find the named tool
// (whatever their scopes).
func (v CatalogView) Has(tenant, name string) bool {
	e, _ := v.s.lookup(tenant, name)
	return e != nil
}

// ForeignChecks is how many checks the gateway ran against schemas it did
// not write (upstreams' and caller tools' arguments and results).
func (v CatalogView) ForeignChecks() int64 { return v.s.foreignChecks.Load() }

func newShelf(newServer func() *sdk.Server, log *slog.Logger) *shelf {
	s := &shelf{log: log}
	s.catalog = newCatalog(newServer, s.refused)
	return s
}

// refused says that the catalog refused a tool: one of its names is
// another tool's.
func (s *shelf) refused(e *entry, taken string) {
	attrs := append(e.origin.attrs(), "tool", e.name, "err", "its name "+taken+" is another tool's")
	s.unlisted(e.origin.source, reasonToolRefused, attrs...)
}

// next returns a channel closed at the next change.
func (s *shelf) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.change == nil {
		s.change = make(chan struct{})
	}
	return s.change
}

func (s *shelf) changed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wake()
}

// wake wakes the waiters of a change; s.mu is held.
func (s *shelf) wake() {
	if s.change != nil {
		close(s.change)
	}
	s.change = make(chan struct{})
}

// Run follows the registries (KV okso_nodes, and okso_remotes and
// okso_callers when Options.Remotes and Options.Callers are set), each
// with its source's watcher, and keeps every tenant's tools in step with
// them, until ctx ends. After a NATS reconnect every watcher watches
// afresh and reconciles: what went away meanwhile is removed, nothing is
// listed twice. Run returns once every goroutine it started has ended.
//
// While its NATS connection is down, the gateway's registry is
// unavailable: tools/list and every call answer so (E_INTERNAL) rather
// than with what the gateway last knew, and it logs one line when the
// connection goes and one when it is back.
func (g *Gateway) Run(ctx context.Context) error {
	status := g.o.NC.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED)
	defer g.o.NC.RemoveStatusListener(status)
	var wg sync.WaitGroup
	if g.o.Kinds != nil {
		// The kinds first, so that the first records are projected
		// with them; a kind learnt later projects again the nodes that
		// name it (devices.reproject).
		loaded := make(chan struct{})
		wg.Go(func() {
			if err := g.o.Kinds.Run(ctx, func() { close(loaded) }, func(kt *schemas.KindTable) {
				g.kinds.Store(kt)
				g.devices.reproject()
				g.shelf.changed() // for Wait
			}); err != nil {
				g.log.Error("registered kinds: follow ended", "err", err)
			}
		})
		select {
		case <-loaded:
		case <-ctx.Done():
			wg.Wait()
			return nil
		}
	}
	wg.Go(func() {
		g.link.follow(ctx, status, func() { // every watcher watches afresh
			for _, s := range g.sources {
				s.watcher().kick()
			}
		})
	})
	for _, s := range g.sources {
		wg.Go(func() { s.watcher().run(ctx, g.log) })
	}
	wg.Go(func() { becomeReady(ctx, g.sources, g.ready) })
	wg.Wait()
	for _, s := range g.sources {
		s.wait() // their watches have ended: nothing starts more
	}
	return nil
}

// link follows the gateway's NATS connection: while it is down, the
// registry is unavailable. Safe for concurrent use.
type link struct {
	nc   *nats.Conn
	log  *slog.Logger
	down atomic.Bool
}

// isDown reports whether the gateway cannot see the registry.
func (l *link) isDown() bool { return l.down.Load() }

// follow marks the registry unavailable while NATS is down, logs the
// change each way, and calls back when the link is back, until ctx ends.
func (l *link) follow(ctx context.Context, status <-chan nats.Status, back func()) {
	if !l.nc.IsConnected() {
		l.down.Store(true)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-status:
			down := st != nats.CONNECTED
			if l.down.Swap(down) == down {
				continue
			}
			if down {
				l.log.Warn("NATS connection lost: tools/list and calls answer E_INTERNAL registry unavailable until it is back")
				continue
			}
			l.log.Info("NATS connection back: reloading the registry")
			back()
		}
	}
}

// becomeReady closes ready once every source's first state is in and
// settled (the device source's nodes probed, or after a bound for nodes
// whose tier is slow to answer). It returns when ctx ends, if before.
func becomeReady(ctx context.Context, sources []source, ready chan<- struct{}) {
	for _, s := range sources {
		select {
		case <-s.watcher().synced:
		case <-ctx.Done():
			return
		}
		s.settle(ctx)
		if ctx.Err() != nil {
			return
		}
	}
	close(ready)
}

// watched is the part of a source that only follows its bucket: it
// starts nothing else.
type watched struct{ w *watcher }

func (s watched) watcher() *watcher    { return s.w }
func (watched) settle(context.Context) {}
func (watched) wait()                  {}

// settleBound bounds how long Ready waits for the device source's first
// probes.
const settleBound = 5 * time.Second
