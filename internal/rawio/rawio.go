// Package rawio reads and writes TCP sockets without telling Go's runtime
// that a system call begins.
//
// Each read or write of a net.Conn enters a system call the way one that
// could block must (entersyscall). In a process that is idle more often
// than not (a device, a mock fleet, a tier of idle devices) that notice
// is costly: Go's monitor thread, asleep while no goroutine runs, is woken
// by it, naps 20 µs and sleeps again: a futex wake, a nanosleep, a futex
// wait and two thread switches per read or write. A socket in Go is
// non-blocking, so its reads and writes never block: [Wrap] makes them
// raw system calls, and waits for the socket through Go's poller as
// net.Conn does.
package rawio

import (
	"context"
	"net"
)

// maxRW is the most one read or write asks for, as in Go's internal/poll.
const maxRW = 1 << 30

// Dial returns d's DialContext, whose connections are wrapped ([Wrap]).
func Dial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return Wrap(c), nil
	}
}
