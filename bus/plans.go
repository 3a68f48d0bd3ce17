package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketPlans is the JetStream KV bucket of fleet.call's plans (DESIGN.md
// §8): what a dry run resolved, keyed by plan id, kept [PlanTTL] so that
// the run that follows may come to any gateway replica.
const BucketPlans = "okso_plans"

// PlanTTL is how long a plan may be run after its dry run.
const PlanTTL = 5 * time.Minute

// Plan is one dry run of fleet.call: the verb, a digest of its arguments
// and of its selector, and the nodes it resolved, which a run with the
// plan's id calls, exactly those. A plan is its caller's: another token
// subject, or another tenant, cannot run it.
type Plan struct {
	ID      string `json:"plan_id"`
	Tenant  string `json:"tenant"`
	Subject string `json:"subject"`
	// Tool is the verb as a canonical name pattern (sysecho.*.echo.invoke).
	Tool string `json:"tool"`
	// Args and Selector are digests of the arguments and of the selector
	// the dry run was given, as the gateway writes them.
	Args     string `json:"args"`
	Selector string `json:"selector"`
	// Class is the strictest safety class of the verb among Nodes when
	// the plan was made.
	Class     string    `json:"safety_class"`
	Nodes     []string  `json:"nodes"` // node ids, sorted
	ExpiresAt time.Time `json:"expires_at"`
}

// ErrNoPlan is returned by [Plans.Get] for a plan id with no live plan:
// never made, or expired.
var ErrNoPlan = errors.New("no such plan, or it expired")

// PlansOptions configures the bucket. The zero value keeps it in memory,
// on one replica.
type PlansOptions struct {
	Replicas int
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// Plans is the plan store (KV okso_plans). It is safe for concurrent use.
type Plans struct{ kv jetstream.KeyValue }

// OpenPlans creates the bucket, or binds to it when it exists. Plans are
// kept in memory: a plan lost with its NATS server is a new dry run away.
func OpenPlans(ctx context.Context, nc *nats.Conn, o PlansOptions) (*Plans, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	kv, err := openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketPlans,
		Description: "okso fleet.call plans",
		History:     1,
		TTL:         PlanTTL,
		Storage:     jetstream.MemoryStorage,
		Replicas:    max(o.Replicas, 1),
	}, o.BindOnly)
	if err != nil {
		return nil, err
	}
	return &Plans{kv: kv}, nil
}

// Put stores a plan under its id, which must be new.
func (p *Plans) Put(ctx context.Context, plan *Plan) error {
	data, err := json.Marshal(plan)
	if err != nil {
		return err
	}
	if _, err := p.kv.Create(ctx, plan.ID, data); err != nil {
		return fmt.Errorf("put plan %s: %w", plan.ID, err)
	}
	return nil
}

// Get returns the live plan of id, or ErrNoPlan. A plan past its
// ExpiresAt is no plan, whether or not JetStream removed it yet.
func (p *Plans) Get(ctx context.Context, id string, now time.Time) (*Plan, error) {
	e, err := p.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNoPlan
	}
	if err != nil {
		return nil, fmt.Errorf("get plan %s: %w", id, err)
	}
	var plan Plan
	if err := json.Unmarshal(e.Value(), &plan); err != nil || plan.ID != id {
		return nil, ErrNoPlan
	}
	if !now.Before(plan.ExpiresAt) {
		return nil, ErrNoPlan
	}
	return &plan, nil
}
