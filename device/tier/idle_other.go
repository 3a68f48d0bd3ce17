//go:build !linux

package tier

// readStash reads what the device sent into stash, waiting for it if
// nothing came yet.
func (c *idleConn) readStash() (int, error) { return c.Conn.Read(c.stash[:]) }
