//go:build !linux

package rawio

import "net"

// Wrap returns c: raw system calls are for Linux only.
func Wrap(c net.Conn) net.Conn { return c }
