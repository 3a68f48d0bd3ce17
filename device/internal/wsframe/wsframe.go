// Package wsframe follows WebSocket frames (RFC 6455 §5.2) in a byte
// stream without keeping them, for the two ends of the device protocol:
// the device tier reads a session's frame boundaries to wait for an idle
// device on a small stack, and a device writes its heartbeat between two
// of the WebSocket library's frames. It is internal to device/ because it
// is nobody's contract, only their shared machinery.
package wsframe

import "encoding/binary"

// Counter follows the frame boundaries of a WebSocket byte stream: it
// reads each frame's header for the payload's length and counts the
// payload's bytes, keeping none of them. It trusts the stream: a malformed
// header is the WebSocket library's to refuse; what the counter makes of
// it only decides where a boundary seems to be. The zero value is at the
// start of a stream.
type Counter struct {
	hdr  [10]byte // the header so far, but its mask key
	got  int      // header bytes so far
	rest uint64   // payload bytes still to come
}

// AtBoundary reports whether the bytes so far end with a whole frame.
func (f *Counter) AtBoundary() bool { return f.got == 0 && f.rest == 0 }

// Feed counts b, the next bytes of the stream.
func (f *Counter) Feed(b []byte) {
	for len(b) > 0 {
		if f.got == 0 && f.rest > 0 {
			k := uint64(len(b))
			if k > f.rest {
				k = f.rest
			}
			f.rest -= k
			b = b[k:]
			continue
		}
		if f.got < len(f.hdr) {
			f.hdr[f.got] = b[0]
		}
		f.got++
		b = b[1:]
		if f.got >= 2 && f.got == headerLen(f.hdr[1]) {
			f.rest, f.got = payloadLen(&f.hdr), 0
		}
	}
}

// headerLen is the length of a frame header whose second byte is b1: two
// bytes, the extended payload length, the mask key.
func headerLen(b1 byte) int {
	n := 2
	switch b1 & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if b1&0x80 != 0 {
		n += 4
	}
	return n
}

// payloadLen is the payload length a whole frame header says.
func payloadLen(hdr *[10]byte) uint64 {
	switch l := hdr[1] & 0x7f; l {
	case 126:
		return uint64(binary.BigEndian.Uint16(hdr[2:4]))
	case 127:
		return binary.BigEndian.Uint64(hdr[2:10])
	default:
		return uint64(l)
	}
}

// HeartbeatLen is the length of a device's heartbeat: an unsolicited
// pong (RFC 6455 §5.5.3, "a unidirectional heartbeat") with no payload,
// masked as every frame from a client is.
const HeartbeatLen = 6

// Heartbeat returns a device's heartbeat frame with mask key mask. A
// pong that answers no ping needs no answer: a tier hears the device
// without writing anything back, and a pong with no payload never
// matches a ping of the tier's (the WebSocket library's carry one).
func Heartbeat(mask uint32) [HeartbeatLen]byte {
	var b [HeartbeatLen]byte
	b[0], b[1] = 0x80|0xA, 0x80 // fin, pong; masked, no payload
	binary.BigEndian.PutUint32(b[2:], mask)
	return b
}

// IsHeartbeat reports whether b is exactly one heartbeat frame, whatever
// its mask key.
func IsHeartbeat(b []byte) bool {
	return len(b) == HeartbeatLen && b[0] == 0x80|0xA && b[1] == 0x80
}
