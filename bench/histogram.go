package bench

import (
	"math"
	"math/bits"
	"time"
)

// Histogram layout: values are nanoseconds. Below 2^subBits a bucket holds
// one value; above, every power of two [2^e, 2^(e+1)) is cut into
// 2^subBits equal buckets, so a bucket is at most 1/64 (1.6%) of the values
// it holds wide. Values of 2^maxExp ns (about 18 minutes) or more share the
// last bucket.
const (
	subBits    = 6
	subCount   = 1 << subBits
	maxExp     = 40
	numBuckets = subCount + (maxExp-subBits)*subCount
)

// Histogram records durations in fixed log-spaced buckets, in the manner of
// HdrHistogram: recording is a few instructions and never allocates, and a
// quantile is exact to within 1.6% (min and max are exact). The zero value
// is an empty histogram ready to use. A Histogram is not safe for
// concurrent use: give each goroutine its own and [Histogram.Merge] them.
type Histogram struct {
	counts   [numBuckets]uint64
	n        uint64
	sum      uint64 // nanoseconds; overflows after 584 years of latency
	min, max uint64
}

// bucketOf returns the index of the bucket holding v nanoseconds.
func bucketOf(v uint64) int {
	if v < subCount {
		return int(v)
	}
	e := bits.Len64(v) - 1 // 2^e <= v < 2^(e+1), e >= subBits
	if e >= maxExp {
		return numBuckets - 1
	}
	sub := int(v>>(e-subBits)) & (subCount - 1)
	return subCount + (e-subBits)*subCount + sub
}

// lowerOf returns the smallest value bucket i holds.
func lowerOf(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	e := (i-subCount)/subCount + subBits
	sub := uint64((i - subCount) % subCount)
	return (subCount + sub) << (e - subBits)
}

// upperOf returns the largest value bucket i holds.
func upperOf(i int) uint64 {
	if i == numBuckets-1 {
		return math.MaxUint64
	}
	return lowerOf(i+1) - 1
}

// Record adds one duration; a negative one counts as zero.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
}

// Merge adds every value recorded in o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min is the smallest value recorded (0 when empty).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max is the largest value recorded (0 when empty).
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean is the average of the values recorded (0 when empty).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / h.n)
}

// Quantile returns the value below or at which a fraction q (0 to 1) of the
// recorded values lie: the upper bound of the bucket holding the value of
// rank ceil(q·n), kept within [Min, Max]. It is 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(max(upperOf(i), h.min), h.max))
		}
	}
	return time.Duration(h.max) // not reached: the counts sum to n
}

// Bin is one bar of a coarse view of a [Histogram]: the values in
// (previous Le, Le].
type Bin struct {
	Le    time.Duration
	Count uint64
}

// Bins returns a coarse view of h with edges at 1, 2 and 5 times each power
// of ten of nanoseconds, from the edge that holds Min to the edge that
// holds Max (nil when empty). A value lands in the bin of the fine bucket
// holding it, so a value within 1.6% above an edge may count below it.
func (h *Histogram) Bins() []Bin {
	if h.n == 0 {
		return nil
	}
	edges := binEdges(h.min, h.max)
	bins := make([]Bin, len(edges))
	for i, e := range edges {
		bins[i].Le = time.Duration(e)
	}
	j := 0
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		v := min(max(lowerOf(i), h.min), h.max)
		for j < len(edges)-1 && v > edges[j] {
			j++
		}
		bins[j].Count += c
	}
	return bins
}

// binEdges returns the 1-2-5 edges from the first at or above lo to the
// first at or above hi.
func binEdges(lo, hi uint64) []uint64 {
	var edges []uint64
	for p := uint64(1); ; p *= 10 {
		for _, m := range [...]uint64{1, 2, 5} {
			e := m * p
			if e < lo && len(edges) == 0 {
				continue
			}
			edges = append(edges, e)
			if e >= hi {
				return edges
			}
		}
		if p > math.MaxUint64/100 {
			return edges
		}
	}
}
