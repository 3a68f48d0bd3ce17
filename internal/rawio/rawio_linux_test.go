package rawio

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

// tcpPair returns both ends of a TCP connection on 127.0.0.1, each
// wrapped.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := <-accepted
	if c == nil {
		t.FailNow()
	}
	a, b = Wrap(d), Wrap(c)
	if _, ok := a.(*Conn); !ok {
		t.Fatalf("Wrap(%T) = %T, want a *rawio.Conn", d, a)
	}
	return a, b
}

// TestConn is x/net's conformance test of a net.Conn: reads and writes
// of every size at once, deadlines, closes, concurrent use.
func TestConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c1, c2 = tcpPair(t)
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

// TestWriteWaits: a write larger than both sockets' buffers waits for the
// reader (EAGAIN, then the poller) and writes every byte once.
func TestWriteWaits(t *testing.T) {
	a, b := tcpPair(t)
	defer a.Close()
	defer b.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	done := make(chan error, 1)
	go func() {
		n, err := a.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	got, err := io.ReadAll(io.LimitReader(b, int64(len(want))))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read are not the bytes written")
	}
}

// TestErrors: what a caller checks for, as net.Conn reports it.
func TestErrors(t *testing.T) {
	t.Run("EOF", func(t *testing.T) {
		a, b := tcpPair(t)
		defer b.Close()
		a.Close()
		if n, err := b.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("Read after the peer closed = %d, %v; want 0, EOF", n, err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		a, b := tcpPair(t)
		defer a.Close()
		defer b.Close()
		b.SetReadDeadline(time.Now().Add(-time.Second))
		_, err := b.Read(make([]byte, 8))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past its deadline: %v, want a timeout", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read past its deadline: %#v, want a *net.OpError of read", err)
		}
	})
	t.Run("closed", func(t *testing.T) {
		a, b := tcpPair(t)
		defer a.Close()
		b.Close()
		if _, err := b.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read of a closed connection: %v, want net.ErrClosed", err)
		}
		if _, err := b.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write to a closed connection: %v, want net.ErrClosed", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		a, b := tcpPair(t)
		defer b.Close()
		a.(*Conn).SetLinger(0) // close with a RST
		a.Close()
		_, err := b.Read(make([]byte, 8))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Read after a reset: %v, want ECONNRESET", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read after a reset: %#v, want a *net.OpError of read", err)
		}
	})
}

// TestWrapOthers: what is not a TCP connection is returned as it is.
func TestWrapOthers(t *testing.T) {
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	if got := Wrap(p); got != p {
		t.Fatalf("Wrap(a pipe) = %T, want the pipe", got)
	}
}
