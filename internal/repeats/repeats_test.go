package repeats

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// lines decodes the JSON lines of a log.
func lines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for l := range strings.Lines(log) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v\n%s", err, l)
		}
		out = append(out, m)
	}
	return out
}

// TestHandler: in one period a repeated warning is written once and
// counted at the period's end, in a line of the same level and message;
// the same message with other logger attributes is a kind of its own;
// info lines are all written; a period with no repeats writes nothing at
// its end; beyond MaxKinds kinds the repeats are counted together.
func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	start := time.Unix(1000, 0)
	h, counts := New(slog.NewJSONHandler(&buf, nil), start)
	log := slog.New(h)
	tier, gw := log.With("role", "device"), log.With("role", "gateway")
	for i := range 1000 {
		tier.Warn("publish reply", "node_id", fmt.Sprint(i))
		if i%10 == 0 {
			gw.Warn("publish reply")
			log.Info("progress", "i", i)
		}
	}
	counts.Flush(start.Add(10 * time.Second))
	var warns, infos int
	more := map[string]any{}
	for _, l := range lines(t, buf.String()) {
		switch {
		case l["more"] != nil:
			more[fmt.Sprint(l["level"], " ", l["role"], " ", l["msg"])] = l["more"]
			if l["in_last"] != "10s" {
				t.Errorf("in_last %v, want 10s", l["in_last"])
			}
		case l["level"] == "WARN":
			warns++
		case l["msg"] == "progress":
			infos++
		}
	}
	want := map[string]any{"WARN device publish reply": 999.0, "WARN gateway publish reply": 99.0}
	if warns != 2 || infos != 100 || fmt.Sprint(more) != fmt.Sprint(want) {
		t.Errorf("%d warnings, %d info lines, repeats %v; want 2, 100, %v", warns, infos, more, want)
	}

	buf.Reset()
	counts.Flush(start.Add(20 * time.Second))
	if buf.Len() != 0 {
		t.Errorf("a period without records wrote %s", buf.String())
	}

	for i := range 1000 {
		log.Error(fmt.Sprintf("kind %d", i))
	}
	counts.Flush(start.Add(30 * time.Second))
	errs := 0
	for _, l := range lines(t, buf.String()) {
		switch {
		case l["msg"] == MsgOtherKinds:
			if l["more"] != float64(1000-MaxKinds-1) {
				t.Errorf("%s: more %v, want %d", MsgOtherKinds, l["more"], 1000-MaxKinds-1)
			}
		case l["more"] != nil:
			t.Errorf("unexpected repeated line %v", l)
		default:
			errs++
		}
	}
	if errs != MaxKinds+1 {
		t.Errorf("%d error lines written, want %d", errs, MaxKinds+1)
	}
}
