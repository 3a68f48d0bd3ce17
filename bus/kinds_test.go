package bus_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/schemas"
)

// thermoDef compiles the golden thermo definition, edited by the
// replacer's pairs.
func thermoDef(t *testing.T, set *schemas.Set, oldnew ...string) *schemas.KindDef {
	t.Helper()
	b, err := os.ReadFile("../schemas/testdata/valid/kind@1.0.0/thermo.json")
	if err != nil {
		t.Fatal(err)
	}
	d, err := set.CompileKind([]byte(strings.NewReplacer(oldnew...).Replace(string(b))))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func loadSet(t *testing.T) *schemas.Set {
	t.Helper()
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// An applied kind is immutable: the same content again is a no-op, other
// content is refused, a new major is a new key; a follower sees each
// kind applied, in file storage.
func TestKinds(t *testing.T) {
	_, nc := startBus(t)
	set := loadSet(t)
	kinds, err := bus.OpenKinds(ctx(t), nc, bus.KindsOptions{Schemas: set})
	if err != nil {
		t.Fatal(err)
	}
	tables := make(chan *schemas.KindTable, 16)
	fctx, stop := context.WithCancel(ctx(t))
	done := make(chan error, 1)
	go func() { done <- kinds.Run(fctx, nil, func(kt *schemas.KindTable) { tables <- kt }) }()
	defer func() { stop(); <-done }()
	next := func(want int) *schemas.KindTable {
		t.Helper()
		for {
			select {
			case kt := <-tables:
				if len(kt.Defs()) == want {
					return kt
				}
			case <-time.After(eventTimeout):
				t.Fatalf("the follower never saw %d kinds", want)
			}
		}
	}
	next(0)

	v1 := thermoDef(t, set)
	if applied, err := kinds.Apply(ctx(t), v1); err != nil || !applied {
		t.Fatalf("Apply: %v, %v", applied, err)
	}
	kt := next(1)
	if _, err := kt.Project("01hzx9k3m4p7q8r9s0t1v2w3xy", []schemas.Capability{{CapID: "b", Kind: "acme.thermo",
		SchemaRef: "mcp://schemas/acme.thermo.read.input@1.0.0", Verbs: []string{"read"}, SafetyClass: schemas.SafetyMutating}}); err != nil {
		t.Errorf("the follower's table projects no acme.thermo: %v", err)
	}
	if applied, err := kinds.Apply(ctx(t), thermoDef(t, set)); err != nil || applied {
		t.Errorf("Apply of the same content: %v, %v; want a no-op", applied, err)
	}
	changed := thermoDef(t, set, `"title": "Read the temperature"`, `"title": "Read it"`)
	if _, err := kinds.Apply(ctx(t), changed); !errors.Is(err, bus.ErrKindChanged) {
		t.Errorf("Apply of other content: %v, want ErrKindChanged", err)
	}
	other := thermoDef(t, set, "acme.thermo", "zeta.boiler")
	if _, err := kinds.Apply(ctx(t), other); err == nil || !strings.Contains(err.Error(), "kind_short thermo is kind acme.thermo's") {
		t.Errorf("Apply of another kind with thermo's kind_short: %v", err)
	}
	v2 := thermoDef(t, set, `"version": "1.0.0"`, `"version": "2.0.0"`, "@1.0.0", "@2.0.0", `"title": "Read the temperature"`, `"title": "Read it"`)
	if applied, err := kinds.Apply(ctx(t), v2); err != nil || !applied {
		t.Fatalf("Apply of a new major: %v, %v", applied, err)
	}
	if k, _ := next(2).Lookup("acme.thermo"); k.Major != 2 {
		t.Errorf("latest major %d, want 2", k.Major)
	}
	table, err := kinds.Table(ctx(t))
	if err != nil || len(table.Defs()) != 2 {
		t.Fatalf("Table: %v, %v", table, err)
	}

	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(ctx(t), bus.BucketKinds)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx(t))
	if err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage != jetstream.FileStorage {
		t.Errorf("okso_kinds is not in file storage: %v", err)
	}
	// A value no okso wrote (not through okso kinds apply) is left out.
	if _, err := kv.Create(ctx(t), "acme.bad.v1", []byte(`{"name":"acme.bad"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx(t), "acme.elsewhere.v1", v1.Doc); err != nil { // under another's key
		t.Fatal(err)
	}
	if table, err := kinds.Table(ctx(t)); err != nil || len(table.Defs()) != 2 {
		t.Errorf("Table with two values no okso wrote: %v, %v", table.Defs(), err)
	}
}

// okso nats init makes the kinds' bucket on an install an older okso
// made; until then a role that may not make buckets is told to run it.
func TestInitStateMakesKinds(t *testing.T) {
	_, nc := startBus(t)
	set := loadSet(t)
	if _, err := bus.OpenKinds(ctx(t), nc, bus.KindsOptions{Schemas: set, BindOnly: true}); !errors.Is(err, bus.ErrNoBucket) {
		t.Fatalf("a role opens the kinds of an older install: %v, want ErrNoBucket", err)
	}
	if err := bus.InitState(ctx(t), nc, bus.StateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.OpenKinds(ctx(t), nc, bus.KindsOptions{Schemas: set, BindOnly: true}); err != nil {
		t.Fatalf("a role opens the kinds after okso nats init: %v", err)
	}
}
