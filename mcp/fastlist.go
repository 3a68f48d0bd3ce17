package mcp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/internal/jsonscan"
	"github.com/okso-io/okso/schemas"
)

// The fast path's tools/list: a stateless gateway answers a tools/list
// it reads exactly as the SDK does with the page's JSON as the page
// cache holds it, written as it is. Through the SDK, encoding/json would
// check those bytes twice (the result's MarshalJSON, then the JSON-RPC
// response around it): most of a cached page's time. Anything it does
// not take (a request of another shape, a cursor that is none, the
// registry down) is the SDK's, which answers it from the same pages.

// listRequest is a tools/list JSON-RPC request.
type listRequest struct {
	id     []byte // as the SDK writes it back
	cursor string
	meta   map[string]json.RawMessage
}

// parseListRequest reads {"jsonrpc":"2.0","id":ID,"method":"tools/list"}
// with, optionally, "params":{"cursor":…,"_meta":{…}}: a string or
// integer id, no duplicate or unknown keys, nothing after it.
func parseListRequest(body []byte) (*listRequest, bool) {
	if jsonscan.Depth(body) > maxFastDepth || !bytes.Contains(body, []byte(`"tools/list"`)) {
		return nil, false
	}
	doc, err := schemas.Decode(body) // refuses duplicate keys and trailing data
	top, ok := doc.(map[string]any)
	if err != nil || !ok || top["jsonrpc"] != "2.0" || top["method"] != "tools/list" {
		return nil, false
	}
	req := new(listRequest)
	if req.id, ok = canonicalID(top["id"]); !ok {
		return nil, false
	}
	switch len(top) {
	case 3:
		return req, true
	case 4:
	default:
		return nil, false
	}
	params, ok := top["params"].(map[string]any)
	if !ok {
		return nil, false
	}
	for k, v := range params {
		switch k {
		case "cursor":
			if req.cursor, ok = v.(string); !ok {
				return nil, false
			}
		case "_meta":
			if _, ok := v.(map[string]any); !ok {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	var raw struct {
		Params struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"params"`
	}
	// Every key is known and exact: the struct decoder picks the same.
	if json.Unmarshal(body, &raw) != nil {
		return nil, false
	}
	req.meta = raw.Params.Meta
	// The SDK decodes _meta into Go values: what it cannot, it refuses.
	for _, v := range req.meta {
		var x any
		if json.Unmarshal(v, &x) != nil {
			return nil, false
		}
	}
	return req, true
}

// listComplete is an empty ListToolsResult whose resultType is
// "complete", as the SDK sets it for a sessionless request (it keeps
// the type unexported; decoding sets it).
var listComplete = func() sdk.ListToolsResult {
	var r sdk.ListToolsResult
	if err := json.Unmarshal([]byte(`{"resultType":"complete","tools":[]}`), &r); err != nil {
		panic(err)
	}
	return r
}()

// serveFastList answers a tools/list it reads; it reports false, having
// written nothing, for one it leaves to the SDK.
func (g *Gateway) serveFastList(w http.ResponseWriter, r *http.Request, body []byte) bool {
	req, ok := parseListRequest(body)
	if !ok || !metaFits(r.Header, "tools/list", "", req.meta, &g.fastMeta) {
		return false
	}
	claims := claimsOf(sdkauth.TokenInfoFromContext(r.Context()))
	if claims == nil || g.link.isDown() {
		return false
	}
	page, err := g.shelf.page(viewOf(claims, g.form, !g.o.NoNodeTools), req.cursor)
	if err != nil {
		return false
	}
	if r.Header.Get("Mcp-Protocol-Version") >= sessionless {
		res := listComplete
		res.NextCursor, res.CacheScope, res.TTLMs = page.NextCursor, page.CacheScope, page.TTLMs
		res.Meta = sdk.Meta{sdk.MetaKeyServerInfo: json.RawMessage(g.results)}
		page.ListToolsResult = &res
	}
	result, err := page.MarshalJSON()
	if err != nil {
		return false
	}
	// The page goes out as it is, between its envelope's two ends: a
	// page is a megabyte or more, not to be copied once more.
	head := make([]byte, 0, len(req.id)+32)
	head = append(head, `{"jsonrpc":"2.0","id":`...)
	head = append(head, req.id...)
	head = append(head, `,"result":`...)
	h := w.Header()
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(head)+len(result)+1))
	for _, b := range [][]byte{head, result, {'}'}} {
		if _, err := w.Write(b); err != nil {
			break
		}
	}
	return true
}
