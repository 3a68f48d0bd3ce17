package roles

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// TestLimitListener: at most maxConns connections are accepted at once,
// a closed one gives its place back, each keeps its socket's SyscallConn
// (a device tier reads idle devices' sockets directly), and Close ends
// an Accept that waits for a place.
func TestLimitListener(t *testing.T) {
	p, err := listen("--test-addr", "127.0.0.1:0", 1)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	first, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc, ok := first.(syscall.Conn)
	if !ok {
		t.Fatalf("accepted %T: no SyscallConn", first)
	}
	if _, err := sc.SyscallConn(); err != nil {
		t.Fatalf("SyscallConn: %v", err)
	}
	dial()
	accepted := make(chan error, 1)
	go func() {
		c, err := p.ln.Accept() // waits for first's place
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	select {
	case err := <-accepted:
		t.Fatalf("a second connection accepted while the first holds the only place (%v)", err)
	default:
	}
	first.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("accept after the first closed: %v", err)
	}
	// The place is free again; one more is accepted, then none.
	dial()
	second, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	go func() {
		_, err := p.ln.Accept()
		accepted <- err
	}()
	p.ln.Close()
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept waiting for a place, listener closed: %v, want net.ErrClosed", err)
	}
}
