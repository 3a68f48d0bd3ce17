package agent

import (
	"net"
	"time"
)

// DefaultPingInterval is a device's [Options.PingInterval] when it sets
// none.
const DefaultPingInterval = 30 * time.Second

// NewDialer returns the dialer a device's HTTP transport should use, for
// a device with the given ping interval (0: DefaultPingInterval). On
// Linux, the kernel drops a connection whose data the tier has left
// unacknowledged for an interval (TCP_USER_TIMEOUT): a heartbeat is data,
// so a connection to a host that vanished without a close is found
// within two intervals, with no ping; elsewhere it is found by the
// device's ping, after the tier's silence of probeBeats intervals.
// [New] dials with it when Options.HTTPClient is nil.
func NewDialer(pingInterval time.Duration) *net.Dialer {
	if pingInterval <= 0 {
		pingInterval = DefaultPingInterval
	}
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: userTimeout(pingInterval)}
}
