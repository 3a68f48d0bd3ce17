package remote

import (
	"bytes"
	"encoding/json"
	"testing"
)

// answerSeeds are answers an upstream sends, and a few it may.
var answerSeeds = []string{
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[{"type":"text","text":"{\"message\":\"hi\"}"}],"structuredContent":{"message":"hi"}}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}},"content":[{"type":"text","text":"x"}],"resultType":"complete","structuredContent":{"message":"hi"}}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[],"isError":true}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[{"type":"image","data":"","mimeType":"image/png"},{"type":"resource_link","uri":"x:y","name":"y"}],"structuredContent":null}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[{"type":"ui"}]}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[{"Type":"text"}]}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"Content":[{"type":"text"}],"content":[]}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"resultType":"input_required","content":[]}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"isError":null,"content":null}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"content":[{"type":"text","type":"image"}]}}`,
	`{"jsonrpc":"2.0","id":"okso-2","result":{}}`,
	`{"jsonrpc":"2.0","id":"okso-1","error":{"code":-32602,"message":"unknown tool"}}`,
	`{"jsonrpc":"2.0","id":"okso-1","result":{"a":1,"a":2}}`,
	` {"id":"okso-1", "jsonrpc":"2.0" ,"result":{"content":[ {"type":"audio"} ]}} `,
}

// FuzzQuickAnswer: whatever quickAnswer and quickToolResult accept,
// encoding/json's reading of it (decodeMessage, decodeToolResult) answers
// the same.
func FuzzQuickAnswer(f *testing.F) {
	for _, s := range answerSeeds {
		f.Add([]byte(s))
	}
	h := &httpCaller{}
	f.Fuzz(func(t *testing.T, data []byte) {
		const id = "okso-1"
		res, ok := quickAnswer(data, id)
		if ok {
			want, mine, err := h.decodeMessage(nil, id, data)
			if err != nil || !mine || !bytes.Equal(res, want) {
				t.Fatalf("quickAnswer(%s) = %s; decodeMessage = %s, %v, %v", data, res, want, mine, err)
			}
		}
		// Every result, as a result of an answer either reader accepted.
		raw := res
		if !ok {
			if !json.Valid(data) {
				return
			}
			raw = data
		}
		out, ok, err := quickToolResult(raw)
		if !ok {
			return
		}
		want, werr := decodeToolResult(raw)
		if (err == nil) != (werr == nil) || err != nil && err.Error() != werr.Error() || !bytes.Equal(out, want) {
			t.Fatalf("quickToolResult(%s) = %s, %v; decodeToolResult = %s, %v", raw, out, err, want, werr)
		}
	})
}

// FuzzIsToolError: whatever quickIsToolError accepts, encoding/json's
// reading of it (decodeIsToolError) answers the same.
func FuzzIsToolError(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"x"}],"structuredContent":{"message":"hi"}}`,
		`{"content":[],"isError":true}`,
		`{"content":[],"isError":false}`,
		`{"content":[],"isError":null}`,
		`{"content":[],"IsError":true}`,
		`{"content":[],"isError":"true"}`,
		`{"isError":true,"isError":false}`,
		`{"content":[{"isError":true}]}`,
		`{"content":[],"isError":true} x`,
		`[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		isErr, ok := quickIsToolError(data)
		if want := decodeIsToolError(data); ok && isErr != want {
			t.Fatalf("quickIsToolError(%s) = %v; decodeIsToolError = %v", data, isErr, want)
		}
	})
}

// BenchmarkIsToolError: reading a result's isError, one pass and
// encoding/json's.
func BenchmarkIsToolError(b *testing.B) {
	res := []byte(`{"content":[{"type":"text","text":"{\"message\":\"bench-1\"}"}],"structuredContent":{"message":"bench-1"}}`)
	b.Run("quick", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := quickIsToolError(res); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeIsToolError(res)
		}
	})
}

// BenchmarkAnswer: reading an upstream's answer to a call and its
// result, one pass and encoding/json's.
func BenchmarkAnswer(b *testing.B) {
	data := []byte(answerSeeds[1])
	h := &httpCaller{}
	b.Run("quick", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			res, _ := quickAnswer(data, "okso-1")
			if _, ok, err := quickToolResult(res); !ok || err != nil {
				b.Fatal("declined")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			res, _, _ := h.decodeMessage(nil, "okso-1", data)
			if _, err := decodeToolResult(res); err != nil {
				b.Fatal(err)
			}
		}
	})
}
