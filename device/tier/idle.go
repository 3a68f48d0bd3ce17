package tier

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"github.com/okso-io/okso/device/internal/wsframe"
)

// errIdle is what an [idleConn] returns, instead of blocking, to a read
// at a frame boundary with nothing received, while its session asks the
// WebSocket library for the next message.
var errIdle = errors.New("device idle")

// idleConn is the connection under a session's WebSocket as the library
// reads it. It lets the session wait for its device on a short stack of
// its own rather than inside the library's reader, so that an idle
// session's goroutine costs 4 KiB of stack rather than 8.
//
// Why it is needed: a tier holds a goroutine per device, parked reading.
// Parked inside the library's Reader, its frames (about 2.5 KB) keep its
// stack at 8 KiB, which the collector shrinks only when less than a
// quarter of it is in use; parked in [idleConn.wait] (about 1 KB), it
// is shrunk to 4 KiB. The library's Reader returns only with a data
// message, though, and an idle device sends pongs (one a ping interval):
// after one, the Reader would read on, and park, for the next frame. So
// the connection follows the frame boundaries of what the device sends
// (the bytes only, nothing is kept), and while the session asks the
// library for a message (yield), a read at a frame boundary with nothing
// received fails with errIdle instead of blocking. The library's Reader
// then returns that error: it has consumed nothing of the next frame,
// and a read error does not close the connection. The session waits in
// wait and asks again.
//
// Reads are serialized by mu, held through a blocking read: the library
// reads under its own lock, and wait is the session's, between two of
// the library's reads; a close handshake that reads while wait blocks
// waits for it as it would for a Reader, for closeGrace at most.
type idleConn struct {
	net.Conn
	mu     sync.Mutex
	yield  bool // a read at a frame boundary with nothing received fails with errIdle
	frames wsframe.Counter
	// stash[off:n] are bytes wait received that Read has not returned
	// yet: enough for a pong in one read.
	stash  [16]byte
	off, n int
	// heartbeat, if set, is called for each of the device's heartbeats
	// (see wait).
	heartbeat func()
	// raw is the socket under Conn, when it is one (readStash).
	raw syscall.RawConn
}

// newIdleConn returns an idleConn reading c.
func newIdleConn(c net.Conn) *idleConn {
	ic := &idleConn{Conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		ic.raw, _ = sc.SyscallConn()
	}
	return ic
}

// Read reads what wait received first, then from the connection.
func (c *idleConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off < c.n {
		k := copy(p, c.stash[c.off:c.n])
		c.off += k
		c.frames.Feed(p[:k])
		return k, nil
	}
	if c.yield && c.frames.AtBoundary() && len(p) > 0 {
		return 0, errIdle
	}
	n, err := c.Conn.Read(p)
	c.frames.Feed(p[:n])
	return n, err
}

// wait blocks until the device has sent something (which the next Read
// returns), or the connection fails. Call it only once the library has
// read everything it buffered (its read failed with errIdle): bytes in
// its buffer are no bytes on the connection.
//
// A heartbeat (an unsolicited pong with no payload, an okso device's
// keepalive; see [wsframe.Heartbeat]) read on its own is the device's
// whole message: wait takes it, calls heartbeat, and waits on, without
// the library. A heartbeat needs no answer, and no ping of the tier's
// waits for a pong with no payload; the wait is at a frame boundary, so
// the frame read is whole.
func (c *idleConn) wait() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off < c.n {
		return nil
	}
	n, err := c.readStash()
	c.off, c.n = 0, n
	if n > 0 {
		return nil // an error that came with data comes again on the next read
	}
	return err
}

// readConn reads the connection into stash, waiting for it if nothing
// came yet; a heartbeat read on its own is heard and not returned.
func (c *idleConn) readConn() (int, error) {
	for {
		n, err := c.Conn.Read(c.stash[:])
		if err != nil || c.heartbeat == nil || !wsframe.IsHeartbeat(c.stash[:n]) {
			return n, err
		}
		c.heartbeat()
	}
}

// setYield says whether a read at a frame boundary may fail with errIdle.
func (c *idleConn) setYield(yield bool) {
	c.mu.Lock()
	c.yield = yield
	c.mu.Unlock()
}
