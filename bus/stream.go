package bus

// Streams (seed 001): the gateway subscribes okso.v1.stream.<stream_id>,
// then sends a [Call] on the node's cmd subject with [HeaderStreamID]. The
// tier answers the request at once (accepted, or an error envelope), then
// publishes each frame's data on the stream subject with [HeaderEvent], and
// a last message with [HeaderStreamEnd] if the device goes away. The
// gateway stops a stream by publishing its id on [NodeCancel].
//
// Frames carry a reply subject of the tier's: when the gateway is gone,
// NATS answers it with "no responders" and the tier stops the device.
const (
	HeaderStreamID  = "Okso-Stream-Id"
	HeaderEvent     = "Okso-Event"
	HeaderStreamEnd = "Okso-Stream-End" // the SSE close reason, e.g. device_offline
	// HeaderProbe marks a request that only asks whether the node's
	// subject is served (the gateway probes before listing a node).
	HeaderProbe = "Okso-Probe"
	// HeaderTakeover, on a node's cancel subject, announces a new session
	// of the node (its session id): older sessions anywhere close with 4409.
	HeaderTakeover = "Okso-Takeover"
)

// Stream close codes and reasons (seed 001 §7), shared by the SSE endpoint
// and the MCP subscribe result.
const (
	StreamNormal        = 1000
	StreamIdleTimeout   = 4408
	StreamBackpressure  = 4413
	StreamRateLimited   = 4429
	StreamDeviceOffline = 4503
)

// StreamReason returns the closed-enum reason of a stream close code.
func StreamReason(code int) string {
	switch code {
	case StreamNormal:
		return "normal"
	case StreamIdleTimeout:
		return "idle_timeout"
	case StreamBackpressure:
		return "backpressure"
	case StreamRateLimited:
		return "rate_limited"
	case StreamDeviceOffline:
		return "device_offline"
	}
	return ""
}

// ReasonDeviceOffline is the [HeaderStreamEnd] value of a stream whose
// device went away.
const ReasonDeviceOffline = "device_offline"
