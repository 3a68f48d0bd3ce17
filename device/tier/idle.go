package tier

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
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
	frames frameCounter
	// stash[off:n] are bytes wait received that Read has not returned
	// yet: enough for a pong in one read.
	stash  [16]byte
	off, n int
}

// Read reads what wait received first, then from the connection.
func (c *idleConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off < c.n {
		k := copy(p, c.stash[c.off:c.n])
		c.off += k
		c.frames.feed(p[:k])
		return k, nil
	}
	if c.yield && c.frames.atBoundary() && len(p) > 0 {
		return 0, errIdle
	}
	n, err := c.Conn.Read(p)
	c.frames.feed(p[:n])
	return n, err
}

// wait blocks until the device has sent something (which the next Read
// returns), or the connection fails. Call it only once the library has
// read everything it buffered (its read failed with errIdle): bytes in
// its buffer are no bytes on the connection.
func (c *idleConn) wait() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.off < c.n {
		return nil
	}
	n, err := c.Conn.Read(c.stash[:])
	c.off, c.n = 0, n
	if n > 0 {
		return nil // an error that came with data comes again on the next read
	}
	return err
}

// setYield says whether a read at a frame boundary may fail with errIdle.
func (c *idleConn) setYield(yield bool) {
	c.mu.Lock()
	c.yield = yield
	c.mu.Unlock()
}

// frameCounter follows the frame boundaries of a WebSocket byte stream
// (RFC 6455 §5.2): it reads each frame's header for the payload's length
// and counts the payload's bytes, keeping none of them. It trusts the
// stream: a malformed header is the library's to refuse; what the counter
// makes of it only decides when errIdle may come. The zero value is at the
// start of a stream.
type frameCounter struct {
	hdr  [10]byte // the header so far, but its mask key
	got  int      // header bytes so far
	rest uint64   // payload bytes still to come
}

// atBoundary reports whether the bytes so far end with a whole frame.
func (f *frameCounter) atBoundary() bool { return f.got == 0 && f.rest == 0 }

// feed counts b, the next bytes of the stream.
func (f *frameCounter) feed(b []byte) {
	for len(b) > 0 {
		if f.got == 0 && f.rest > 0 {
			k := uint64(len(b))
			if k > f.rest {
				k = f.rest
			}
			f.rest -= k
			b = b[k:]
			continue
		}
		if f.got < len(f.hdr) {
			f.hdr[f.got] = b[0]
		}
		f.got++
		b = b[1:]
		if f.got >= 2 && f.got == headerLen(f.hdr[1]) {
			f.rest, f.got = payloadLen(&f.hdr), 0
		}
	}
}

// headerLen is the length of a frame header whose second byte is b1: two
// bytes, the extended payload length, the mask key.
func headerLen(b1 byte) int {
	n := 2
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if b1&0x80 != 0 {
		n += 4
	}
	return n
}

// payloadLen is the payload length a whole frame header says.
func payloadLen(hdr *[10]byte) uint64 {
	switch l := hdr[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(hdr[2:4]))
	case 127:
		return binary.BigEndian.Uint64(hdr[2:10])
	default:
		return uint64(l)
	}
}
