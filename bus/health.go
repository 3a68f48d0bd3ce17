package bus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// bucketScrapeTimeout bounds the stream-info requests of one scrape.
const bucketScrapeTimeout = 2 * time.Second

// BucketHealth is a Prometheus collector of the JetStream buckets a role
// reads (DESIGN.md §11): for each, whether its stream answers, its
// messages and bytes, and its replicas that are current. It asks
// JetStream at each scrape (a STREAM.INFO request per bucket, which
// every role that binds a bucket may send), never in between.
type BucketHealth struct {
	nc                       *nats.Conn
	buckets                  []string
	up, msgs, bytes, current *prometheus.Desc
}

// NewBucketHealth collects the health of buckets over nc; part labels
// the series (gateway, tier).
func NewBucketHealth(nc *nats.Conn, part string, buckets ...string) *BucketHealth {
	labels := prometheus.Labels{"part": part}
	return &BucketHealth{nc: nc, buckets: buckets,
		up: prometheus.NewDesc("okso_jetstream_bucket_up", "1 when the bucket's stream answered the scrape's stream-info request, else 0.",
			[]string{"bucket"}, labels),
		msgs:  prometheus.NewDesc("okso_jetstream_bucket_messages", "Messages the bucket's stream holds.", []string{"bucket"}, labels),
		bytes: prometheus.NewDesc("okso_jetstream_bucket_bytes", "Bytes the bucket's stream holds.", []string{"bucket"}, labels),
		current: prometheus.NewDesc("okso_jetstream_bucket_replicas_current",
			"Replicas of the bucket's stream that are current (the leader and its current followers).", []string{"bucket"}, labels),
	}
}

// Describe implements prometheus.Collector.
func (h *BucketHealth) Describe(ch chan<- *prometheus.Desc) {
	ch <- h.up
	ch <- h.msgs
	ch <- h.bytes
	ch <- h.current
}

// Collect implements prometheus.Collector.
func (h *BucketHealth) Collect(ch chan<- prometheus.Metric) {
	js, err := jetstream.New(h.nc)
	ctx, cancel := context.WithTimeout(context.Background(), bucketScrapeTimeout)
	defer cancel()
	for _, b := range h.buckets {
		var info *jetstream.StreamInfo
		if err == nil {
			var s jetstream.Stream
			if s, err = js.Stream(ctx, kvStream(b)); err == nil {
				info = s.CachedInfo()
			}
		}
		if info == nil {
			ch <- prometheus.MustNewConstMetric(h.up, prometheus.GaugeValue, 0, b)
			err = nil // the next bucket is asked all the same
			if ctx.Err() != nil {
				err = ctx.Err() // out of time: the rest are down for this scrape
			}
			continue
		}
		ch <- prometheus.MustNewConstMetric(h.up, prometheus.GaugeValue, 1, b)
		ch <- prometheus.MustNewConstMetric(h.msgs, prometheus.GaugeValue, float64(info.State.Msgs), b)
		ch <- prometheus.MustNewConstMetric(h.bytes, prometheus.GaugeValue, float64(info.State.Bytes), b)
		current := 1.0 // the leader, or the one server of a single-replica stream
		if info.Cluster != nil {
			for _, r := range info.Cluster.Replicas {
				if r.Current {
					current++
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(h.current, prometheus.GaugeValue, current, b)
	}
}
