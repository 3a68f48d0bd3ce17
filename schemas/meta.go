package schemas

// Keys of an MCP _meta that okso writes or reads, on every surface
// (DESIGN.md §5, §8, §9.1).
const (
	// MetaRequestID carries the call's request id: in every result the
	// gateway answers, and in every call the remote tier makes upstream.
	MetaRequestID = "io.okso/request_id"
	// MetaError carries the error envelope of a call okso failed.
	MetaError = "io.okso/error"
	// MetaTraceparent carries the W3C trace context of a call made
	// upstream.
	MetaTraceparent = "traceparent"
	// MetaSafetyClass, MetaNodeID, MetaKind and MetaUpstream describe a
	// listed tool.
	MetaSafetyClass = "io.okso/safety_class"
	MetaNodeID      = "io.okso/node_id"
	MetaKind        = "io.okso/kind"
	MetaUpstream    = "io.okso/upstream"
	// MetaName is a listed tool's canonical name, when it is listed by
	// another (its safe name): a call by either works.
	MetaName = "io.okso/name"
)
