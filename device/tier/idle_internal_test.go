package tier

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// frame returns a WebSocket frame header for a payload of n bytes,
// masked or not, followed by the payload.
func frame(opcode byte, n int, masked bool) []byte {
	b := []byte{0x80 | opcode, 0}
	switch {
	case n < 126:
		b[1] = byte(n)
	case n <= 0xffff:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if masked {
		b[1] |= 0x80
		b = append(b, 1, 2, 3, 4)
	}
	return append(b, bytes.Repeat([]byte{'x'}, n)...)
}

// TestFrameCounter: fed a stream of frames in pieces of any size, the
// counter is at a boundary exactly where a frame ends.
func TestFrameCounter(t *testing.T) {
	var stream []byte
	ends := map[int]bool{0: true}
	for _, f := range []struct {
		op     byte
		n      int
		masked bool
	}{
		{0xA, 0, true}, {0x1, 5, true}, {0xA, 3, true}, {0x1, 125, true}, {0x1, 126, true},
		{0x9, 0, false}, {0x1, 300, false}, {0x0, 0xffff, true}, {0x1, 0x10000, true}, {0x8, 2, true},
	} {
		stream = append(stream, frame(f.op, f.n, f.masked)...)
		ends[len(stream)] = true
	}
	for _, piece := range []int{1, 2, 3, 7, 14, 131, 1024, len(stream)} {
		var c frameCounter
		for at := 0; at < len(stream); {
			next := min(at+piece, len(stream))
			c.feed(stream[at:next])
			at = next
			if got, want := c.atBoundary(), ends[at]; got != want && (piece == 1 || want) {
				t.Fatalf("pieces of %d: at byte %d, boundary %v, want %v", piece, at, got, want)
			}
		}
		if !c.atBoundary() {
			t.Fatalf("pieces of %d: not at a boundary at the end", piece)
		}
	}
}

// TestIdleConn: while yielding, a read at a frame boundary with nothing
// received fails with errIdle, and one within a frame reads on; what wait
// receives comes first on the next read.
func TestIdleConn(t *testing.T) {
	device, tier := net.Pipe()
	defer device.Close()
	// A read that blocks when it should not fails the test, not hangs it.
	if err := tier.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	c := &idleConn{Conn: tier}
	c.setYield(true)
	buf := make([]byte, 64)
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, errIdle) {
		t.Fatalf("read at a boundary: %d, %v; want errIdle", n, err)
	}
	pong := frame(0xA, 3, true)
	go func() { _, _ = device.Write(pong[:4]) }() // net.Pipe: returns once read
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); err != nil || !bytes.Equal(buf[:n], pong[:4]) {
		t.Fatalf("read after wait: %q, %v; want %q", buf[:n], err, pong[:4])
	}
	go func() { _, _ = device.Write(pong[4:]) }()
	if _, err := io.ReadFull(c, buf[:len(pong)-4]); err != nil { // within the frame: blocks, not errIdle
		t.Fatalf("read within a frame: %v", err)
	}
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, errIdle) {
		t.Fatalf("read after the frame: %d, %v; want errIdle", n, err)
	}
	c.setYield(false)
	go func() { _, _ = device.Write([]byte{0x81}) }()
	if n, err := c.Read(buf); n != 1 || err != nil { // not yielding: blocks
		t.Fatalf("read not yielding: %d, %v", n, err)
	}
}
