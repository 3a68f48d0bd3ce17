package wsframe

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Transport is the RoundTripper of a device's WebSocket dials: the body
// of a 101 answer, the connection the WebSocket library then reads and
// writes, becomes a [Body], handed to the dial's caller through the
// request's context ([WithBody]). Any other answer passes as it is.
//
// The WebSocket library sends no pong of its own accord, so a device
// writes its heartbeat below the library, on the connection the library
// writes to.
type Transport struct{ Base http.RoundTripper }

func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.Base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, err
	}
	slot, _ := r.Context().Value(bodyKey{}).(**Body)
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if slot == nil || !ok {
		return resp, nil // the dial does without heartbeats
	}
	b := &Body{ReadWriteCloser: rwc, epoch: time.Now()}
	*slot = b
	resp.Body = b
	return resp, nil
}

// Client returns c (nil: http.DefaultClient) with its transport wrapped
// in a [Transport].
func Client(c *http.Client) *http.Client {
	if c == nil {
		c = http.DefaultClient
	}
	bc := *c
	base := bc.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	bc.Transport = Transport{Base: base}
	return &bc
}

type bodyKey struct{}

// WithBody returns ctx for a dial through a [Transport], and where the
// dial leaves the connection's Body (nil if it made none).
func WithBody(ctx context.Context) (context.Context, **Body) {
	slot := new(*Body)
	return context.WithValue(ctx, bodyKey{}, slot), slot
}

// Body is the connection under a device's WebSocket, as the library
// writes it: it counts the frames written, so that a heartbeat goes in
// only between two of them, and notes when the device last wrote. Its
// writes are serialized.
type Body struct {
	io.ReadWriteCloser
	epoch time.Time
	wrote atomic.Int64 // when the device last wrote, since epoch
	mu    sync.Mutex
	out   Counter
}

func (b *Body) Write(p []byte) (int, error) {
	b.mu.Lock()
	n, err := b.ReadWriteCloser.Write(p)
	b.out.Feed(p[:n])
	b.mu.Unlock()
	b.wrote.Store(int64(time.Since(b.epoch)))
	return n, err
}

// Silent is how long the device has written nothing.
func (b *Body) Silent() time.Duration {
	return time.Since(b.epoch) - time.Duration(b.wrote.Load())
}

// Beat writes a heartbeat, unless the library is half way through a
// frame: the device is not silent then, and its frame is heard. It
// blocks as a write does: bound it as the library's writes are.
func (b *Body) Beat() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.out.AtBoundary() {
		return nil
	}
	hb := Heartbeat(rand.Uint32())
	n, err := b.ReadWriteCloser.Write(hb[:])
	b.out.Feed(hb[:n])
	b.wrote.Store(int64(time.Since(b.epoch)))
	return err
}
