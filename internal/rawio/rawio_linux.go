package rawio

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

var _ net.Conn = (*Conn)(nil)

// Conn is a TCP connection whose Read and Write are raw system calls.
// Everything else is the *net.TCPConn's.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn
}

// Wrap returns c with raw reads and writes when it is a TCP connection on
// Linux, and c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{TCPConn: tc, rc: rc}
}

// Read reads as net.Conn's Read does: what the socket holds, waiting for
// something when it holds nothing.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	var (
		n     int
		errno syscall.Errno
	)
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, e := ReadFD(fd, p)
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait until the socket is readable
			}
			n, errno = r, e
			return true
		}
	})
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case errno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, as net.Conn's Write does, waiting whenever the
// socket's buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	var (
		n     int
		errno syscall.Errno
	)
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			chunk := p[n:min(len(p), n+maxRW)]
			r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
			switch e {
			case 0:
				n += int(r)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait until the socket is writable
			default:
				errno = e
				return true
			}
		}
		return true
	})
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case errno != 0:
		return n, c.opError("write", os.NewSyscallError("write", errno))
	}
	return n, nil
}

// opError is err as net.Conn's Read or Write would return it: a
// *net.OpError for op whose Err says what happened (a deadline passed,
// the connection was closed, the peer reset it).
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) { // the RawConn's, named raw-read or raw-write
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// ReadFD reads the non-blocking socket fd into p (not empty) with a raw
// system call, for a caller inside a syscall.RawConn's Read.
func ReadFD(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), e
}
