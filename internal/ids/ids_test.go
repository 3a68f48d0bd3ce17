package ids

import (
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
)

// TestNew: each id is a ULID of now, and no two are the same.
func TestNew(t *testing.T) {
	seen := map[string]bool{}
	before := ulid.Now()
	for range 10000 {
		s := New()
		u, err := ulid.ParseStrict(s)
		if err != nil {
			t.Fatalf("New() = %q: %v", s, err)
		}
		if ms := u.Time(); ms < before || ms > ulid.Now() {
			t.Fatalf("New() = %q, of %v: not of now", s, ulid.Time(ms).Format(time.RFC3339Nano))
		}
		if seen[s] {
			t.Fatalf("New() = %q twice", s)
		}
		seen[s] = true
	}
}

func BenchmarkNew(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = New()
	}
}
