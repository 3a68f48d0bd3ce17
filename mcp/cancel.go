package mcp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/nats-io/nats.go"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// A stateless gateway gets a client's notifications/cancelled as a POST of
// its own, which the SDK answers in a throwaway session that does not hold
// the request it names; and that POST may land on any replica. So the
// gateway relays it: whichever replica receives it publishes on
// [bus.CallCancel] under a key made of the caller's token and the request
// id, and the replica serving that request, subscribed to that key while
// it runs, cancels it. A caller can only name its own requests: the key
// is derived from the token the gateway verified, never taken from the
// client. (A stateful gateway's sessions cancel their own requests.)

// rpcIDKey carries, in a request's context, the JSON-RPC id of the one
// request its body holds, as [canonicalID] writes it.
type rpcIDKey struct{}

// canonicalID writes a JSON-RPC id as the SDK writes it back: a string
// re-encoded, an integer in decimal; ok is false for any other id.
func canonicalID(v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		b, _ := json.Marshal(v)
		return b, true
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return nil, false
		}
		return strconv.AppendInt(nil, n, 10), true
	}
	return nil, false
}

// rpcIDText is an id canonicalID wrote as jsonrpc.request.id carries it:
// a number's digits, a string's text.
func rpcIDText(id []byte) string {
	var s string
	if len(id) > 0 && id[0] == '"' && json.Unmarshal(id, &s) == nil {
		return s
	}
	return string(id)
}

// cancelKey names one request of one caller on [bus.CallCancel].
func cancelKey(c *auth.Claims, id []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(c.Tenant), []byte(c.Subject), []byte(c.ID), id} {
		h.Write(strconv.AppendInt(nil, int64(len(part)), 10))
		h.Write([]byte{':'})
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// decodeRPC decodes a JSON-RPC message strictly (no duplicate keys, no
// trailing data), or returns nil.
func decodeRPC(body []byte) map[string]any {
	doc, err := schemas.Decode(body)
	if err != nil {
		return nil
	}
	m, _ := doc.(map[string]any)
	return m
}

// cancelledID returns the request id a notifications/cancelled body
// names, as canonicalID writes it.
func cancelledID(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"notifications/cancelled"`)) {
		return nil, false // the usual case, decided without decoding
	}
	m := decodeRPC(body)
	if m == nil || m["jsonrpc"] != "2.0" || m["method"] != "notifications/cancelled" {
		return nil, false
	}
	if _, isRequest := m["id"]; isRequest {
		return nil, false
	}
	params, _ := m["params"].(map[string]any)
	return canonicalID(params["requestId"])
}

// callID returns the id of the tools/call request a body holds, as
// canonicalID writes it: the one request a client may cancel.
func callID(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"tools/call"`)) {
		return nil, false // a list, an initialize: decided without decoding
	}
	m := decodeRPC(body)
	if m == nil {
		return nil, false
	}
	return canonicalID(m["id"])
}

// cancels relays a stateless gateway's cancellations (above); a
// stateful gateway's sessions cancel their own requests.
type cancels struct {
	nc       *nats.Conn
	stateful bool
	log      *slog.Logger
}

// relay publishes a caller's cancellation for the replica serving the
// request, and answers the notification as the SDK would (202).
func (cs cancels) relay(w http.ResponseWriter, r *http.Request, id []byte) {
	c := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	if c != nil {
		if err := cs.nc.Publish(bus.CallCancel(cancelKey(c, id)), nil); err != nil {
			cs.log.Warn("relay a cancellation", "err", err)
		}
	}
	w.WriteHeader(http.StatusAccepted)
}

// cancellable returns ctx, cancelled also when the caller cancels the
// request from any replica (stateless) or drops its HTTP request; stop
// releases what it holds. The request is the one of id (as canonicalID
// writes it; nil: the JSON-RPC id in ctx, if any). The subscription is
// in place once the NATS connection is next flushed.
func (cs cancels) cancellable(ctx context.Context, claims *auth.Claims, id []byte) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var watch sync.WaitGroup // stop waits for it
	if hc, ok := ctx.Value(httpCallKey{}).(*httpCall); ok && !cs.stateful {
		// The SDK does not tie a handler to its HTTP request before
		// protocol 2026-07-28: a client that hung up would be noticed at
		// the next write only.
		watch.Go(func() {
			select {
			case <-hc.hungUp:
				cancel()
			case <-ctx.Done():
			}
		})
	}
	var sub *nats.Subscription
	if id == nil {
		id, _ = ctx.Value(rpcIDKey{}).([]byte)
	}
	if id != nil && !cs.stateful && claims != nil {
		var err error
		sub, err = cs.nc.Subscribe(bus.CallCancel(cancelKey(claims, id)), func(*nats.Msg) { cancel() })
		if err != nil {
			cs.log.Warn("subscribe to cancellations", "err", err)
		}
	}
	return ctx, func() {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		cancel()
		watch.Wait()
	}
}
