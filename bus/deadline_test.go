package bus_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/okso-io/okso/bus"
)

// TestNewRequestID: a fresh request id is a ULID of this millisecond,
// and two are never the same.
func TestNewRequestID(t *testing.T) {
	before := ulid.Now()
	seen := map[string]bool{}
	for range 1000 {
		id := bus.NewRequestID()
		u, err := ulid.ParseStrict(id)
		if err != nil || u.String() != id || u.Time() < before || u.Time() > ulid.Now() || seen[id] {
			t.Fatalf("NewRequestID() = %q (%v): not a fresh ULID", id, err)
		}
		seen[id] = true
	}
}

func TestCallDeadline(t *testing.T) {
	now := time.Now()
	ms := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	const skew = 250 * time.Millisecond
	tests := []struct {
		name               string
		budget, deadlineAt string
		want               time.Duration // -1: refused
	}{
		{"no headers: the capability's", "", "", 2 * time.Second},
		{"a shorter budget", "500", "", 500 * time.Millisecond},
		{"a longer budget", "5000", "", 2 * time.Second},
		{"no budget left: ignored, as before", "0", "", 2 * time.Second},
		{"a deadline sooner than the budget", "5000", ms(time.Second), time.Second + skew},
		{"a deadline later than the budget", "1000", ms(time.Minute), time.Second},
		{"a deadline just passed, within the skew", "5000", ms(-100 * time.Millisecond), skew - 100*time.Millisecond},
		{"a deadline passed by the skew", "5000", ms(-skew), -1},
		{"a deadline long passed", "5000", ms(-10 * time.Second), -1},
		{"a malformed deadline", "5000", "soon", 2 * time.Second},
		{"a zero deadline", "5000", "0", 2 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := bus.CallDeadline(now, 2*time.Second, tc.budget, tc.deadlineAt, skew)
			if tc.want < 0 {
				if ok {
					t.Fatalf("CallDeadline = %v, want refused", got)
				}
				return
			}
			// Unix milliseconds round now down by up to a millisecond.
			if !ok || got > tc.want || got < tc.want-time.Millisecond {
				t.Fatalf("CallDeadline = %v, %v; want %v", got, ok, tc.want)
			}
		})
	}
}
