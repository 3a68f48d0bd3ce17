//go:build !linux

package rawio

import "net"

// Conn is a connection as [Wrap] returns it; on this platform, only
// ever the one given.
type Conn struct{ net.Conn }

// Wrap returns c: raw system calls are for Linux only.
func Wrap(c net.Conn) net.Conn { return c }
