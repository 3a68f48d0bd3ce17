package bus

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// FuzzAuditEncode: an event encoded by hand is byte for byte what
// json.Marshal writes.
func FuzzAuditEncode(f *testing.F) {
	f.Add(int64(1795316088218123456), 0, "gateway", "demo", "agent", "01m80hetn3a3x84z368v26yy0p",
		"sysecho.01m80hetn3a3x84z368v26yy0p.echo.invoke", DecisionAllowed, "", int64(123456), "01M80HFSRTP6P5RGFY7RW4197Q")
	f.Add(int64(0), 3600, "tier", "", "", "", "", DecisionDenied, CodeSafetyDenied, int64(-1), "")
	f.Add(int64(-62135596800000000000/100), -37, "a<b", "é", "\"", "\\", "&", "", "\x00", int64(0), "\u2028")
	f.Add(int64(253402300800000000), 0, "x", "", "", "", "", "", "", int64(0), "")
	f.Fuzz(func(t *testing.T, unixNano int64, offset int, actor, tenant, subject, jti, tool, decision, code string, dur int64, reqID string) {
		e := AuditEvent{
			Time:  time.Unix(0, unixNano).In(time.FixedZone("z", offset%(24*3600))),
			Actor: actor, Tenant: tenant, Subject: subject, JTI: jti, Tool: tool,
			Decision: decision, Code: code, Duration: time.Duration(dur), RequestID: reqID,
		}
		want, wantErr := json.Marshal(e)
		got, err := e.encode()
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Fatalf("encode %s (%v)\njson.Marshal %s (%v)", got, err, want, wantErr)
		}
	})
}
