package bus_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
)

// A plan is kept for any replica to read until it expires; an unknown
// id, and a plan read past its expiry (JetStream removes it only later),
// are ErrNoPlan; a plan id is never written twice.
func TestPlans(t *testing.T) {
	_, nc := startBus(t)
	p, err := bus.OpenPlans(ctx(t), nc, bus.PlansOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	plan := &bus.Plan{ID: "01hzx9k3m4p7q8r9s0t1v2w3xy", Tenant: "demo", Subject: "agent", Tool: "sysecho.*.echo.invoke",
		Args: "a", Selector: "s", Class: "read_only", Nodes: []string{"n1", "n2"}, ExpiresAt: now.Add(bus.PlanTTL)}
	if err := p.Put(ctx(t), plan); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx(t), plan); err == nil {
		t.Error("a plan id was written twice")
	}
	other, err := bus.OpenPlans(ctx(t), nc, bus.PlansOptions{BindOnly: true}) // another replica
	if err != nil {
		t.Fatal(err)
	}
	got, err := other.Get(ctx(t), plan.ID, now)
	if err != nil || got.Tenant != "demo" || !slices.Equal(got.Nodes, plan.Nodes) || got.Tool != plan.Tool {
		t.Fatalf("Get = %+v, %v; want the plan put", got, err)
	}
	if _, err := other.Get(ctx(t), plan.ID, plan.ExpiresAt); !errors.Is(err, bus.ErrNoPlan) {
		t.Errorf("Get at its expiry: %v, want ErrNoPlan", err)
	}
	if _, err := other.Get(ctx(t), "01hzx9k3m4p7q8r9s0t1v2w3xz", now); !errors.Is(err, bus.ErrNoPlan) {
		t.Errorf("Get of an unknown id: %v, want ErrNoPlan", err)
	}
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx(t), bus.BucketPlans)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx(t))
	if err != nil || st.TTL() != bus.PlanTTL {
		t.Errorf("okso_plans keeps a plan %v (%v), want %v", st.TTL(), err, bus.PlanTTL)
	}
}

// okso nats init makes the plans' bucket on an install an older okso
// made; until then a role that may not make buckets is told to run it.
func TestInitStateMakesPlans(t *testing.T) {
	_, nc := startBus(t)
	if _, err := bus.OpenPlans(ctx(t), nc, bus.PlansOptions{BindOnly: true}); !errors.Is(err, bus.ErrNoBucket) {
		t.Fatalf("a role opens the plans of an older install: %v, want ErrNoBucket", err)
	}
	if err := bus.InitState(ctx(t), nc, bus.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.OpenPlans(ctx(t), nc, bus.PlansOptions{BindOnly: true}); err != nil {
		t.Fatalf("a role opens the plans after okso nats init: %v", err)
	}
}
