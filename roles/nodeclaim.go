package roles

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/okso-io/okso/internal/pidlock"
)

// nodeClaim is a process's hold on a node of its data dir: the node whose
// device token the data dir's key mints (its agent-node-id, or a client
// certificate's). Two agents serving one node take it from each other
// (the tier closes the older session, 4409), so a second process that
// would serve it refuses to start, naming the first, unless told to take
// it over (--replace). The hold is a lock file in the data dir; the
// kernel lets it go when its process dies. Make one with claimNode; it
// is safe for concurrent use.
type nodeClaim struct {
	log             *slog.Logger
	dir, node, path string
	from            int // with --replace, the pid of the process taken over (0: unknown)

	mu   sync.Mutex
	lock *pidlock.Lock // nil while a replaced process still holds it, and once released
	own  pidlock.Claim // what this process wrote in the file
}

// claimNode takes the hold on node of dataDir. When another process holds
// it, claimNode refuses, saying which, or with replace marks the node as
// this process's (the holder sees the mark, and stops serving the node
// when its session is replaced) and leaves the lock to [nodeClaim.hold].
func claimNode(log *slog.Logger, dataDir, node string, replace bool) (*nodeClaim, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	log = log.With("role", "agent")
	n := &nodeClaim{log: log, dir: dataDir, node: node, path: filepath.Join(dataDir, "agent-"+node+".lock")}
	l, err := pidlock.TryLock(n.path)
	if err == nil {
		n.lock, n.own = l, l.Claim()
		return n, nil
	}
	var held *pidlock.HeldError
	if !errors.As(err, &held) {
		return nil, err
	}
	by := "a running process"
	if held.Holder.PID > 0 {
		by = fmt.Sprintf("a running process (pid %d)", held.Holder.PID)
	}
	if !replace {
		return nil, fmt.Errorf("data dir %s: its node %s is already served by %s; --replace takes it over", dataDir, node, by)
	}
	if n.own, err = pidlock.Mark(n.path); err != nil {
		return nil, err
	}
	n.from = held.Holder.PID
	log.Info("taking the node over (--replace)", "data_dir", dataDir, "node_id", node, "from_pid", n.from)
	return n, nil
}

// held reports whether n has the lock.
func (n *nodeClaim) held() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lock != nil
}

// hold takes the lock once the process n replaced lets it go, which it
// does when its session was replaced; it tries again with a growing
// wait, up to a second, until ctx ends.
func (n *nodeClaim) hold(ctx context.Context) {
	for wait := 20 * time.Millisecond; !n.held(); wait = min(2*wait, time.Second) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		n.mu.Lock() // takenOver must not read the new claim before n.own is it
		l, err := pidlock.TryLock(n.path)
		if err == nil {
			n.lock, n.own = l, l.Claim()
		}
		n.mu.Unlock()
		if err != nil {
			continue // still held
		}
		n.log.Info("node taken over: the other process let it go", "data_dir", n.dir, "node_id", n.node, "from_pid", n.from)
	}
}

// takenOver returns the claim of another process that marked the node as
// its own (--replace) since n wrote its own.
func (n *nodeClaim) takenOver() (pidlock.Claim, bool) {
	if n == nil {
		return pidlock.Claim{}, false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c, err := pidlock.Read(n.path)
	return c, err == nil && c.ID != "" && c.ID != n.own.ID
}

// release lets the node go, at once, for a process taking it over.
func (n *nodeClaim) release() {
	if n == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lock != nil {
		_ = n.lock.Release() // closing a lock file does not fail in a way that keeps the lock
		n.lock = nil
	}
}
