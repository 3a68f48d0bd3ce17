package bench

import (
	"math"
	"testing"
	"time"
)

// TestHistogramBuckets: buckets tile the values without gaps, each holds
// what bucketOf says, and none is wider than 1/64 of its lower bound.
func TestHistogramBuckets(t *testing.T) {
	for i := range numBuckets - 1 {
		lo, hi := lowerOf(i), upperOf(i)
		if lo > hi {
			t.Fatalf("bucket %d: lower %d > upper %d", i, lo, hi)
		}
		if lowerOf(i+1) != hi+1 {
			t.Fatalf("bucket %d ends at %d, bucket %d starts at %d", i, hi, i+1, lowerOf(i+1))
		}
		if bucketOf(lo) != i || bucketOf(hi) != i {
			t.Fatalf("bucket %d [%d, %d]: bucketOf gives %d and %d", i, lo, hi, bucketOf(lo), bucketOf(hi))
		}
		if lo >= subCount && float64(hi-lo+1)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d [%d, %d] is wider than 1/%d", i, lo, hi, subCount)
		}
	}
	for _, v := range []uint64{1 << maxExp, 1<<maxExp + 12345, math.MaxUint64} {
		if got := bucketOf(v); got != numBuckets-1 {
			t.Errorf("bucketOf(%d) = %d, want the last bucket %d", v, got, numBuckets-1)
		}
	}
}

func durations(ns ...int64) []time.Duration {
	d := make([]time.Duration, len(ns))
	for i, v := range ns {
		d[i] = time.Duration(v)
	}
	return d
}

// span returns n values evenly spread over [from, to].
func span(from, to time.Duration, n int) []time.Duration {
	d := make([]time.Duration, n)
	for i := range d {
		d[i] = from + (to-from)*time.Duration(i)/time.Duration(n-1)
	}
	return d
}

// TestHistogramQuantiles: quantiles within 1.6% of the exact order
// statistic, min and max exact.
func TestHistogramQuantiles(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration
		q      float64
		want   time.Duration // the exact value of rank ceil(q·n)
	}{
		{"empty", nil, 0.5, 0},
		{"one value p0", durations(1234567), 0, 1234567},
		{"one value p50", durations(1234567), 0.5, 1234567},
		{"one value p100", durations(1234567), 1, 1234567},
		{"small exact values", durations(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.5, 5},
		{"zero and negative", durations(0, -5, 0, 0), 0.99, 0},
		{"1µs..1ms p50", span(time.Microsecond, time.Millisecond, 1000), 0.50, 500 * time.Microsecond},
		{"1µs..1ms p90", span(time.Microsecond, time.Millisecond, 1000), 0.90, 900 * time.Microsecond},
		{"1µs..1ms p99", span(time.Microsecond, time.Millisecond, 1000), 0.99, 990 * time.Microsecond},
		{"1µs..1ms max", span(time.Microsecond, time.Millisecond, 1000), 1, time.Millisecond},
		{"1µs..1ms min", span(time.Microsecond, time.Millisecond, 1000), 0, time.Microsecond},
		{"bimodal p50", append(span(400*time.Microsecond, 500*time.Microsecond, 90),
			span(40*time.Millisecond, 50*time.Millisecond, 10)...), 0.50, 455056},
		{"bimodal p90", append(span(400*time.Microsecond, 500*time.Microsecond, 90),
			span(40*time.Millisecond, 50*time.Millisecond, 10)...), 0.90, 500 * time.Microsecond},
		{"bimodal p99", append(span(400*time.Microsecond, 500*time.Microsecond, 90),
			span(40*time.Millisecond, 50*time.Millisecond, 10)...), 0.99, 48888888},
		{"beyond range", durations(int64(time.Hour)), 0.5, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Histogram
			for _, v := range tt.values {
				h.Record(v)
			}
			got := h.Quantile(tt.q)
			if tt.want == 0 {
				if got != 0 {
					t.Fatalf("Quantile(%v) = %v, want 0", tt.q, got)
				}
				return
			}
			if rel := math.Abs(float64(got-tt.want)) / float64(tt.want); rel > 1.0/subCount {
				t.Errorf("Quantile(%v) = %v, want %v within 1.6%% (off by %.2f%%)", tt.q, got, tt.want, 100*rel)
			}
			if got < h.Min() || got > h.Max() {
				t.Errorf("Quantile(%v) = %v outside [%v, %v]", tt.q, got, h.Min(), h.Max())
			}
			if h.Count() != uint64(len(tt.values)) {
				t.Errorf("Count = %d, want %d", h.Count(), len(tt.values))
			}
		})
	}
}

// TestHistogramMerge: merging per-goroutine histograms equals recording
// everything in one.
func TestHistogramMerge(t *testing.T) {
	values := span(3*time.Microsecond, 7*time.Second, 5000)
	var all, a, b, empty Histogram
	for i, v := range values {
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	var m Histogram
	m.Merge(&empty)
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(&empty)
	if m != all {
		t.Fatalf("merged: n %d min %v max %v mean %v; want n %d min %v max %v mean %v",
			m.Count(), m.Min(), m.Max(), m.Mean(), all.Count(), all.Min(), all.Max(), all.Mean())
	}
	if m.Min() != 3*time.Microsecond || m.Max() != 7*time.Second {
		t.Errorf("min %v max %v, want 3µs and 7s", m.Min(), m.Max())
	}
}

// TestHistogramBins: 1-2-5 edges from the one holding min to the one
// holding max, every value in exactly one bin.
func TestHistogramBins(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration
		want   []Bin
	}{
		{"empty", nil, nil},
		{"one value", durations(300_000), []Bin{{500 * time.Microsecond, 1}}},
		{"on an edge", durations(1_000_000), []Bin{{time.Millisecond, 1}}},
		{"spread", durations(150_000, 180_000, 450_000, 900_000, 3_000_000), []Bin{
			{200 * time.Microsecond, 2},
			{500 * time.Microsecond, 1},
			{time.Millisecond, 1},
			{2 * time.Millisecond, 0},
			{5 * time.Millisecond, 1},
		}},
		{"nanoseconds", durations(0, 1, 3, 7), []Bin{{1, 2}, {2, 0}, {5, 1}, {10, 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Histogram
			for _, v := range tt.values {
				h.Record(v)
			}
			got := h.Bins()
			if len(got) != len(tt.want) {
				t.Fatalf("Bins() = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("Bins() = %v, want %v", got, tt.want)
				}
			}
		})
	}
}

// TestHistogramRecordAllocs: recording never allocates.
func TestHistogramRecordAllocs(t *testing.T) {
	h := new(Histogram)
	if n := testing.AllocsPerRun(1000, func() { h.Record(1234567 * time.Nanosecond) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	var h Histogram
	for i := 0; b.Loop(); i++ {
		h.Record(time.Duration(i*7919) % time.Second)
	}
}
