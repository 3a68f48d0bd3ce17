package agent

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/okso-io/okso/schemas"
)

// MetricsSample is one system.metrics sample (seed 001 §5.1).
type MetricsSample struct {
	TsMs          int64   `json:"ts_ms"`
	NodeID        string  `json:"node_id"`
	CPUPct        float64 `json:"cpu_pct"`
	MemBytes      int64   `json:"mem_bytes"`
	MemTotalBytes int64   `json:"mem_total_bytes"`
	DiskPct       float64 `json:"disk_pct"`
	Load1m        float64 `json:"load_1m"`
	Load5m        float64 `json:"load_5m"`
	Load15m       float64 `json:"load_15m"`
}

// Sampler measures a machine. Sample fills every field but TsMs and NodeID.
type Sampler interface {
	Sample(ctx context.Context) (MetricsSample, error)
}

// DefaultIntervalMs is the subscribe cadence when the caller gives none.
const DefaultIntervalMs = 5000

// MetricsCapability is the system.metrics capability: a snapshot and a
// subscription, read-only.
func MetricsCapability() schemas.Capability {
	return schemas.Capability{
		CapID:       "metrics",
		Kind:        schemas.KindMetrics,
		SchemaRef:   schemas.MetricsSubInput,
		Verbs:       []string{"snapshot", "subscribe"},
		SafetyClass: schemas.SafetyReadOnly,
		Constraints: schemas.Constraints{RateLimitRPS: 10, MaxConcurrency: 8, DeadlineMsDefault: 2000},
	}
}

// Metrics returns the handlers of system.metrics for a node measured by s:
// "metrics.snapshot" and the stream "metrics.subscribe".
func Metrics(nodeID string, s Sampler) (map[string]Handler, map[string]StreamHandler) {
	sample := func(ctx context.Context) (MetricsSample, error) {
		m, err := s.Sample(ctx)
		m.TsMs, m.NodeID = time.Now().UnixMilli(), nodeID
		return m, err
	}
	snapshot := func(ctx context.Context, _ json.RawMessage) (any, error) { return sample(ctx) }
	subscribe := func(ctx context.Context, args json.RawMessage, emit func(any) error) error {
		sample := sample
		if f, ok := s.(interface{ Fork() Sampler }); ok {
			// A sampler that measures between samples gets one per stream,
			// so that two streams do not shorten each other's window.
			fs := f.Fork()
			sample = func(ctx context.Context) (MetricsSample, error) {
				m, err := fs.Sample(ctx)
				m.TsMs, m.NodeID = time.Now().UnixMilli(), nodeID
				return m, err
			}
		}
		// A float: 1e3 and 1000.0 are integers to the schema, not to Go's int.
		in := struct {
			IntervalMs float64 `json:"interval_ms"`
		}{DefaultIntervalMs}
		if err := json.Unmarshal(args, &in); err != nil {
			return err
		}
		tick := time.NewTicker(time.Duration(in.IntervalMs) * time.Millisecond)
		defer tick.Stop()
		for {
			m, err := sample(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			if err := emit(m); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
		}
	}
	return map[string]Handler{"metrics.snapshot": snapshot},
		map[string]StreamHandler{"metrics.subscribe": subscribe}
}

// MockSampler yields plausible synthetic figures: a bounded random walk per
// device, reproducible from its seed. It is safe for concurrent use.
type MockSampler struct {
	mu   sync.Mutex
	rnd  *rand.Rand
	last MetricsSample
}

// NewMockSampler returns a sampler whose walk is fixed by seed and key
// (use the node id, so each device of a seeded fleet walks its own way).
func NewMockSampler(seed uint64, key string) *MockSampler {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	r := rand.New(rand.NewPCG(seed, h.Sum64()))
	total := int64(1+r.IntN(16)) << 30
	return &MockSampler{rnd: r, last: MetricsSample{
		CPUPct:        5 + 30*r.Float64(),
		MemTotalBytes: total,
		MemBytes:      int64(float64(total) * (0.2 + 0.4*r.Float64())),
		DiskPct:       10 + 60*r.Float64(),
	}}
}

func clamp(v, lo, hi float64) float64 { return math.Min(hi, math.Max(lo, v)) }

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// Sample takes one step of the walk.
func (m *MockSampler) Sample(context.Context) (MetricsSample, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, r := m.last, m.rnd
	s.CPUPct = round2(clamp(s.CPUPct+r.NormFloat64()*5, 0, 100))
	frac := clamp(float64(s.MemBytes)/float64(s.MemTotalBytes)+r.NormFloat64()*0.01, 0.05, 0.98)
	s.MemBytes = int64(frac * float64(s.MemTotalBytes))
	s.DiskPct = round2(clamp(s.DiskPct+r.NormFloat64()*0.05, 0, 100))
	cores := 4.0
	s.Load1m = round2(clamp(s.Load1m*0.8+cores*s.CPUPct/100*0.2, 0, 64))
	s.Load5m = round2(clamp(s.Load5m*0.95+s.Load1m*0.05, 0, 64))
	s.Load15m = round2(clamp(s.Load15m*0.98+s.Load5m*0.02, 0, 64))
	m.last = s
	return s, nil
}
