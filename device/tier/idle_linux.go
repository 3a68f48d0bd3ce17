package tier

import (
	"io"
	"os"
	"syscall"

	"github.com/okso-io/okso/device/internal/wsframe"
	"github.com/okso-io/okso/internal/rawio"
)

// readStash reads what the device sent into stash, waiting for it if
// nothing came yet; a heartbeat read on its own is heard and not
// returned. On a socket, after a heartbeat it waits for the next bytes
// without the read that would find nothing: a read that returned less
// than it asked for emptied the socket, and bytes that come after it
// wake the poller, which the wait (inside one RawConn.Read, which
// forgets no wake-up between its tries) hears. That read was half the
// system calls of an idle device's heartbeat.
func (c *idleConn) readStash() (int, error) {
	if c.raw == nil {
		return c.readConn()
	}
	var (
		n    int
		rerr error
	)
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			k, e := rawio.ReadFD(fd, c.stash[:]) // no system call notice: see package rawio
			switch {
			case e == syscall.EINTR:
				continue
			case e == syscall.EAGAIN:
				return false // wait until the socket is readable
			case e != 0:
				rerr = os.NewSyscallError("read", e)
			case k == 0:
				rerr = io.EOF
			case c.heartbeat != nil && wsframe.IsHeartbeat(c.stash[:k]):
				c.heartbeat()
				return false // k < len(stash): the socket is empty
			default:
				n = k
			}
			return true
		}
	})
	if err != nil {
		return 0, err // closed, or past a deadline
	}
	return n, rerr
}
