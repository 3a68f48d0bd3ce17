package wsframe

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// frame returns a WebSocket frame header for a payload of n bytes,
// masked or not, followed by the payload.
func frame(opcode byte, n int, masked bool) []byte {
	b := []byte{0x80 | opcode, 0}
	switch {
	case n < 126:
		b[1] = byte(n)
	case n <= 0xffff:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if masked {
		b[1] |= 0x80
		b = append(b, 1, 2, 3, 4)
	}
	return append(b, bytes.Repeat([]byte{'x'}, n)...)
}

// TestCounter: fed a stream of frames in pieces of any size, the counter
// is at a boundary exactly where a frame ends.
func TestCounter(t *testing.T) {
	var stream []byte
	ends := map[int]bool{0: true}
	for _, f := range []struct {
		op     byte
		n      int
		masked bool
	}{
		{0xA, 0, true}, {0x1, 5, true}, {0xA, 3, true}, {0x1, 125, true}, {0x1, 126, true},
		{0x9, 0, false}, {0x1, 300, false}, {0x0, 0xffff, true}, {0x1, 0x10000, true}, {0x8, 2, true},
	} {
		stream = append(stream, frame(f.op, f.n, f.masked)...)
		ends[len(stream)] = true
	}
	for _, piece := range []int{1, 2, 3, 7, 14, 131, 1024, len(stream)} {
		var c Counter
		for at := 0; at < len(stream); {
			next := min(at+piece, len(stream))
			c.Feed(stream[at:next])
			at = next
			if got, want := c.AtBoundary(), ends[at]; got != want && (piece == 1 || want) {
				t.Fatalf("pieces of %d: at byte %d, boundary %v, want %v", piece, at, got, want)
			}
		}
		if !c.AtBoundary() {
			t.Fatalf("pieces of %d: not at a boundary at the end", piece)
		}
	}
}

// TestHeartbeat: the heartbeat is one whole masked pong with no payload,
// and IsHeartbeat tells it from every other short frame.
func TestHeartbeat(t *testing.T) {
	hb := Heartbeat(0x01020304)
	if want := frame(0xA, 0, true); !bytes.Equal(hb[:], want) {
		t.Fatalf("heartbeat %x, want %x", hb, want)
	}
	var c Counter
	c.Feed(hb[:])
	if !c.AtBoundary() || !IsHeartbeat(hb[:]) {
		t.Fatalf("heartbeat: boundary %v, IsHeartbeat %v", c.AtBoundary(), IsHeartbeat(hb[:]))
	}
	for _, b := range [][]byte{
		frame(0xA, 0, false),     // not masked: a protocol error, the library's
		frame(0xA, 1, true),      // a pong with a payload may answer a ping
		frame(0x9, 0, true),      // a ping needs a pong
		frame(0x1, 0, true),      // a message
		append(hb[:], hb[:]...),  // two frames
		hb[:HeartbeatLen-1],      // part of one
		{0x0A, 0x80, 1, 2, 3, 4}, // no fin
	} {
		if IsHeartbeat(b) {
			t.Errorf("IsHeartbeat(%x) = true", b)
		}
	}
}
