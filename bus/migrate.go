package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// An older okso kept its buckets in NATS's global account; where okso's
// roles are kept apart they are in AccountState. On disk, an embedded
// server's store holds each account's streams under jetstream/<account>,
// so an okso that starts with credentials on a store an older okso used
// moves what must outlive it (the revocations and the node bindings)
// into the new accounts: it reads them with a server of its own on the
// store first, keeps them in a file, deletes the old buckets, and, once
// the admin has made the new ones, writes them there ([Server.Restore]).
// Nothing is lost if it stops between the two: the file stays until then.

// globalAccount is NATS's account of a server without accounts.
const globalAccount = "$G"

// movedFile keeps what moves out of the global account until it is in
// the new buckets.
const movedFile = "okso-moved-state.json"

// movedState is what moves: revoked token ids with the Unix second they
// are revoked until, and node ids with their tenants.
type movedState struct {
	Revoked  map[string]int64  `json:"revoked,omitempty"`
	Bindings map[string]string `json:"bindings,omitempty"`
}

// oksoStreams lists the streams of okso's buckets that account has on
// disk in store.
func oksoStreams(store, account string) []string {
	entries, err := os.ReadDir(filepath.Join(store, "jetstream", account, "streams"))
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "KV_okso_") {
			names = append(names, e.Name())
		}
	}
	return names
}

// moveOutOfGlobal moves the older okso's revocations and bindings in
// store's global account to store's movedFile, and deletes its buckets.
func moveOutOfGlobal(store string, log *slog.Logger) error {
	o := &server.Options{ServerName: "okso-move", JetStream: true, NoSigs: true, NoLog: true, DontListen: true, StoreDir: store}
	ns, err := server.NewServer(o)
	if err != nil {
		return err
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("the store's server is not ready")
	}
	nc, err := (&Server{ns: ns}).Connect("okso-move")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	moved, err := readMoved(store)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for _, b := range []string{BucketRevoked, BucketNodeTenants} {
		if _, err := js.Stream(ctx, kvStream(b)); errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		state, err := readState(ctx, nc, b, ">")
		if err != nil {
			return fmt.Errorf("read %s: %w", b, err)
		}
		for key, e := range state {
			if e.value == nil {
				continue
			}
			if b == BucketRevoked {
				until := time.Now().Add(MaxRevocation).Unix()
				if s, err := strconv.ParseInt(string(e.value), 10, 64); err == nil {
					until = s
				}
				moved.Revoked[key] = until
			} else {
				moved.Bindings[key] = string(e.value)
			}
		}
	}
	if err := writeMoved(store, moved); err != nil {
		return err
	}
	for _, name := range oksoStreams(store, globalAccount) {
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
	log.Info("an older okso's revocations and node bindings are moving to okso's accounts",
		"revocations", len(moved.Revoked), "bindings", len(moved.Bindings))
	return nil
}

func readMoved(store string) (*movedState, error) {
	m := &movedState{Revoked: map[string]int64{}, Bindings: map[string]string{}}
	b, err := os.ReadFile(filepath.Join(store, movedFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(store, movedFile), err)
	}
	if m.Revoked == nil {
		m.Revoked = map[string]int64{}
	}
	if m.Bindings == nil {
		m.Bindings = map[string]string{}
	}
	return m, nil
}

// writeMoved writes m whole (a new file, synced, then renamed).
func writeMoved(store string, m *movedState) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(store, ".moved-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(store, movedFile))
}

// Restore writes what moved out of an older okso's global account (when
// it started, [StartServer]) into okso's buckets, which must exist (the
// admin made them: [InitState]), then forgets it. nc is the admin's.
func (s *Server) Restore(ctx context.Context, nc *nats.Conn) error {
	if s.store == "" {
		return nil
	}
	m, err := readMoved(s.store)
	if err != nil || len(m.Revoked)+len(m.Bindings) == 0 {
		if err == nil {
			_ = os.Remove(filepath.Join(s.store, movedFile))
		}
		return err
	}
	revs, err := OpenRevocations(ctx, nc, RevocationOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	for jti, until := range m.Revoked {
		if u := time.Unix(until, 0); u.After(time.Now()) {
			if err := revs.Revoke(ctx, jti, u); err != nil {
				return err
			}
		}
	}
	b, err := OpenBindings(ctx, nc, BindingsOptions{BindOnly: true})
	if err != nil {
		return err
	}
	for node, tenant := range m.Bindings {
		// No session holds the node: the binding keeps its TTL.
		_, rev, err := b.Bind(ctx, node, tenant)
		if err == nil {
			err = b.Release(ctx, node, tenant, rev)
		}
		if err != nil && !errors.Is(err, ErrOtherTenant) {
			return err
		}
	}
	return os.Remove(filepath.Join(s.store, movedFile))
}

// nodesToFile moves the registry's bucket to file storage if an older
// okso made it in memory. JetStream cannot change a stream's storage in
// place: its records are read, the stream made again on file, its
// sequences going on from the old one's (so that followers and leases
// take the records written again as newer than those they knew), and
// the records written again, each unless a record of its node was
// written meanwhile: an offline one to expire after the offline
// retention, one under a tier's lease with none, an older tier's own
// lease with the lease's TTL (its tier takes it again at its refresh).
func nodesToFile(ctx context.Context, js jetstream.JetStream, o RegistryOptions) error {
	st, err := js.Stream(ctx, kvStream(BucketNodes))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return err
	}
	if info.Config.Storage == jetstream.FileStorage {
		return nil
	}
	records, err := readState(ctx, js.Conn(), BucketNodes, ">")
	if err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, kvStream(BucketNodes)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	cfg := info.Config
	cfg.Storage, cfg.FirstSeq = jetstream.FileStorage, info.State.LastSeq+1
	cfg.RePublish = rePublish(BucketNodes)
	if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return err
	}
	for key, e := range records {
		var n Node
		if e.value == nil || json.Unmarshal(e.value, &n) != nil || n.NodeID != key {
			continue
		}
		opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(0)}
		switch {
		case n.Offline():
			opts = append(opts, jetstream.WithMsgTTL(o.OfflineRetention))
		case !n.TierLease:
			opts = append(opts, jetstream.WithMsgTTL(o.TTL))
		}
		if _, err := js.Publish(ctx, "$KV."+BucketNodes+"."+key, e.value, opts...); err != nil && !wrongSequence(err) {
			return fmt.Errorf("write node %s again: %w", key, err)
		}
	}
	return nil
}
