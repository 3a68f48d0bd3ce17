package bus

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/okso-io/okso/schemas"
)

// BucketKinds is the JetStream KV bucket of the kinds an operator
// registered (DESIGN.md §4, §12), in file storage: one key per kind and
// major version, [schemas.KindDef.Key] (<kind>.v<major>: a NATS KV key
// may not hold the '@' of DESIGN.md's <kind>@<major>), its value the
// definition in its stored form ([schemas.KindDef.Doc]). Only the
// admin writes it (okso kinds apply); gateways and tiers follow it.
const BucketKinds = "okso_kinds"

// ErrKindChanged is returned, wrapped, by [Kinds.Apply] for a kind and
// major applied already with other content: an applied key never
// changes.
var ErrKindChanged = errors.New("applied already with other content; an applied kind never changes: give the new content a new major version")

// KindsOptions configures [OpenKinds]. Schemas is required; the zero
// value of the rest keeps a bucket it creates on one replica and logs to
// [slog.Default].
type KindsOptions struct {
	Schemas  *schemas.Set
	Replicas int
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
	// Log says why a stored definition was left out of the table, and
	// why [Kinds.Run] follows the bucket anew.
	Log *slog.Logger
}

// Kinds is the bucket of registered kinds. It is safe for concurrent
// use.
type Kinds struct {
	nc  *nats.Conn
	kv  jetstream.KeyValue
	set *schemas.Set
	log *slog.Logger
}

// OpenKinds creates the bucket in file storage, or binds to it when it
// exists.
func OpenKinds(ctx context.Context, nc *nats.Conn, o KindsOptions) (*Kinds, error) {
	if o.Schemas == nil {
		return nil, errors.New("open kv " + BucketKinds + ": no schemas")
	}
	kv, err := openKindsKV(ctx, nc, o.Replicas, o.BindOnly)
	if err != nil {
		return nil, err
	}
	return &Kinds{nc: nc, kv: kv, set: o.Schemas, log: cmp.Or(o.Log, slog.Default())}, nil
}

// openKindsKV creates the bucket, or binds to it.
func openKindsKV(ctx context.Context, nc *nats.Conn, replicas int, bindOnly bool) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	return openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketKinds,
		Description: "okso registered kinds",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		// A definition with its schemas is one message.
		MaxValueSize: schemas.MaxKindDefinition,
	}, bindOnly)
}

// Apply writes a definition under its key unless the key holds it
// already: applied says whether it wrote. A key that holds other
// content is left as it is ([ErrKindChanged]); so is a definition that
// conflicts with the registered kinds (a kind_short another kind has,
// or another major's) or names an upstream's name as its kind_short
// (the two share a namespace, DESIGN.md §8).
func (k *Kinds) Apply(ctx context.Context, d *schemas.KindDef) (applied bool, err error) {
	same, err := k.compare(ctx, d)
	if err != nil || same {
		return false, err
	}
	table, err := k.Table(ctx)
	if err != nil {
		return false, err
	}
	if err := table.Conflict(d); err != nil {
		return false, fmt.Errorf("apply kind %s: %w", d.Key(), err)
	}
	if up, err := readState(ctx, k.nc, BucketRemotes, d.Short); err == nil && up[d.Short].value != nil {
		return false, fmt.Errorf("apply kind %s: kind_short %s is the name of an upstream", d.Key(), d.Short)
	}
	if _, err := k.kv.Create(ctx, d.Key(), d.Doc); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) { // another apply, meanwhile
			if same, cerr := k.compare(ctx, d); cerr != nil || same {
				return false, cerr
			}
			return false, fmt.Errorf("apply kind %s: %w", d.Key(), ErrKindChanged)
		}
		return false, fmt.Errorf("apply kind %s: %w", d.Key(), err)
	}
	return true, nil
}

// compare reports whether d's key holds d already; an error when it
// holds other content.
func (k *Kinds) compare(ctx context.Context, d *schemas.KindDef) (same bool, err error) {
	e, err := k.kv.Get(ctx, d.Key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("apply kind %s: %w", d.Key(), err)
	}
	held, err := k.set.CompileKind(e.Value())
	if err != nil || !bytes.Equal(held.Doc, d.Doc) {
		return false, fmt.Errorf("apply kind %s: %w", d.Key(), ErrKindChanged)
	}
	return true, nil
}

// Table reads the bucket and returns the kind table of its definitions.
func (k *Kinds) Table(ctx context.Context) (*schemas.KindTable, error) {
	state, err := readState(ctx, k.nc, BucketKinds, ">")
	if err != nil {
		return nil, err
	}
	defs := map[string]*schemas.KindDef{}
	for key, e := range state {
		if e.value != nil {
			if d := k.compile(key, e.value); d != nil {
				defs[key] = d
			}
		}
	}
	return k.table(defs), nil
}

// compile compiles the definition stored under key; nil, logged, when
// it is not one (no okso wrote it: okso kinds apply checks it first).
func (k *Kinds) compile(key string, value []byte) *schemas.KindDef {
	d, err := k.set.CompileKind(value)
	if err == nil && d.Key() != key {
		err = fmt.Errorf("stored under %s, not its key %s", key, d.Key())
	}
	if err != nil {
		k.log.Warn("registered kind left out", "bucket", BucketKinds, "key", key, "err", err)
		return nil
	}
	return d
}

// table makes the table of defs, and logs the definitions it leaves out.
func (k *Kinds) table(defs map[string]*schemas.KindDef) *schemas.KindTable {
	list := make([]*schemas.KindDef, 0, len(defs))
	for _, d := range defs {
		list = append(list, d)
	}
	t, errs := schemas.NewKindTable(list)
	for _, err := range errs {
		k.log.Warn("registered kind left out", "bucket", BucketKinds, "err", err)
	}
	return t
}

// Run follows the bucket until ctx ends: it calls use with the kind
// table of the bucket's present state, then ready once, then use again
// with a new table at every change. use and ready run on Run's
// goroutine, one call at a time. A watch can end with the connection:
// Run logs why, as a warning, and follows the bucket again a second
// later (and calls use again with what it then reads). It returns nil
// once ctx ends.
func (k *Kinds) Run(ctx context.Context, ready func(), use func(*schemas.KindTable)) error {
	var once sync.Once
	for {
		defs := map[string]*schemas.KindDef{}
		synced := false
		publish := func() {
			t := k.table(defs)
			keys := make([]string, 0, len(t.Defs()))
			for _, d := range t.Defs() {
				keys = append(keys, d.Key())
			}
			k.log.Info("registered kinds", "kinds", keys)
			use(t)
		}
		err := follow(ctx, k.nc, BucketKinds, ">", func(c kvChange) {
			delete(defs, c.key)
			if c.value != nil {
				if d := k.compile(c.key, c.value); d != nil {
					defs[c.key] = d
				}
			}
			if synced {
				publish()
			}
		}, func() {
			synced = true
			publish()
			if ready != nil {
				once.Do(ready)
			}
		})
		if ctx.Err() != nil {
			return nil
		}
		k.log.Warn("kinds: watch ended, following again in 1s", "bucket", BucketKinds, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}
