//go:build !linux

package tier

// readStash reads what the device sent into stash, waiting for it if
// nothing came yet; a heartbeat read on its own is heard and not
// returned.
func (c *idleConn) readStash() (int, error) { return c.readConn() }
