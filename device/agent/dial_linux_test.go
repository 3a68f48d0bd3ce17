package agent_test

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/okso-io/okso/device/agent"
)

// TestDialerUserTimeout: a device's connection tells the kernel to drop
// it when the tier leaves its data unacknowledged for a ping interval.
func TestDialerUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, interval := range []time.Duration{0, 7 * time.Second} {
		c, err := agent.NewDialer(interval).DialContext(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var got int
		var gerr error
		if err := raw.Control(func(fd uintptr) {
			got, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		}); err != nil || gerr != nil {
			t.Fatal(err, gerr)
		}
		want := interval
		if want == 0 {
			want = agent.DefaultPingInterval
		}
		if time.Duration(got)*time.Millisecond != want {
			t.Errorf("interval %v: TCP_USER_TIMEOUT %d ms, want %v", interval, got, want)
		}
		c.Close()
	}
}
