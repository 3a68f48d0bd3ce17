package tier

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/okso-io/okso/device/internal/wsframe"
)

// pong is a device's pong with a payload of three bytes, masked.
var pong = []byte{0x80 | 0xA, 0x80 | 3, 1, 2, 3, 4, 'x', 'x', 'x'}

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

// TestIdleConnHeartbeat: wait takes a heartbeat read on its own, tells
// of it, and waits on; what comes next (here a pong, which needs the
// library) is the next read's.
func TestIdleConnHeartbeat(t *testing.T) {
	device, tier := net.Pipe()
	defer device.Close()
	if err := tier.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	beats := 0
	c := &idleConn{Conn: tier, heartbeat: func() { beats++ }}
	c.setYield(true)
	hb := wsframe.Heartbeat(0x01020304)
	go func() {
		for range 3 {
			_, _ = device.Write(hb[:]) // net.Pipe: one write, one read
		}
		_, _ = device.Write(pong)
	}()
	if err := c.wait(); err != nil {
		t.Fatal(err)
	}
	if beats != 3 {
		t.Fatalf("wait told of %d heartbeats, want 3", beats)
	}
	buf := make([]byte, 64)
	if n, err := c.Read(buf); err != nil || !bytes.Equal(buf[:n], pong) {
		t.Fatalf("read after wait: %x, %v; want the pong %x", buf[:n], err, pong)
	}
}
