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
// library) is the next read's; a connection closed by the device ends
// wait with an error. Over a pipe, and over a TCP socket, which may join
// frames the device wrote apart.
func TestIdleConnHeartbeat(t *testing.T) {
	pipe := func(t *testing.T) (net.Conn, net.Conn) { return net.Pipe() }
	socket := tcpPair
	for name, connect := range map[string]func(*testing.T) (net.Conn, net.Conn){"pipe": pipe, "socket": socket} {
		t.Run(name, func(t *testing.T) {
			device, tier := connect(t)
			defer device.Close()
			defer tier.Close()
			// A read that blocks when it should not fails the test, not hangs it.
			if err := tier.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			heard := make(chan struct{}, 1)
			c := newIdleConn(tier)
			if _, isSocket := tier.(*net.TCPConn); isSocket != (c.raw != nil) {
				t.Fatalf("socket %v, read raw %v", isSocket, c.raw != nil)
			}
			c.heartbeat = func() { heard <- struct{}{} }
			c.setYield(true)
			wrote := make(chan error, 1)
			go func() {
				for range 3 {
					hb := wsframe.Heartbeat(0x01020304)
					if _, err := device.Write(hb[:]); err != nil {
						wrote <- err
						return
					}
					<-heard // one at a time: a socket would join them
				}
				_, err := device.Write(pong)
				wrote <- err
			}()
			if err := c.wait(); err != nil {
				t.Fatal(err)
			}
			if err := <-wrote; err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 64)
			if n, err := io.ReadAtLeast(c, buf, len(pong)); err != nil || !bytes.Equal(buf[:n], pong) {
				t.Fatalf("read after wait: %x, %v; want the pong %x", buf[:n], err, pong)
			}
			if n, err := c.Read(buf); n != 0 || !errors.Is(err, errIdle) {
				t.Fatalf("read after the pong: %d, %v; want errIdle", n, err)
			}
			device.Close()
			if err := c.wait(); err == nil {
				t.Fatal("wait on a connection the device closed: no error")
			}
		})
	}
}

// TestIdleConnNoWakeUpLost: bytes that come right behind a heartbeat,
// while wait goes back to waiting, end the wait: over a TCP socket a
// heartbeat followed at once by a pong, two hundred times.
func TestIdleConnNoWakeUpLost(t *testing.T) {
	device, tier := tcpPair(t)
	defer device.Close()
	defer tier.Close()
	c := newIdleConn(tier)
	c.heartbeat = func() {}
	c.setYield(true)
	hb := wsframe.Heartbeat(0x01020304)
	buf := make([]byte, 64)
	for i := range 200 {
		// A wait that missed the pong would block: the deadline fails it.
		if err := tier.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, _ = device.Write(hb[:])
			_, _ = device.Write(pong)
		}()
		var got []byte
		for !bytes.HasSuffix(got, pong) {
			if err := c.wait(); err != nil {
				t.Fatalf("round %d: wait: %v (read %x so far)", i, err, got)
			}
			for {
				n, err := c.Read(buf)
				if errors.Is(err, errIdle) {
					break
				}
				if err != nil {
					t.Fatalf("round %d: read: %v", i, err)
				}
				got = append(got, buf[:n]...)
			}
		}
		if !bytes.Equal(got, pong) && !bytes.Equal(got, append(hb[:], pong...)) {
			t.Fatalf("round %d: read %x, want the pong, after the heartbeat or not", i, got)
		}
	}
}

// tcpPair returns the two ends of a TCP connection on 127.0.0.1.
func tcpPair(t *testing.T) (device, tier net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if device, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if tier, err = ln.Accept(); err != nil {
		device.Close()
		t.Fatal(err)
	}
	return device, tier
}
