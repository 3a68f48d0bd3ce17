package bus

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketOAuth is the JetStream KV bucket of okso's own OAuth
// authorization server (DESIGN.md §6): its registered clients, pending
// authorization requests, the operator's decisions on them, authorization
// codes and grants with their refresh-token families. Every gateway
// replica shares it, so a code issued by one is redeemed at another, once.
const BucketOAuth = "okso_oauth"

// The kinds of keys in okso_oauth: each key is <kind>.<id>. The gateway
// writes every kind but [OAuthConsent]; only the admin's credential may
// write that one, so a gateway's credential cannot approve a request by
// itself (roles' permissions, [Role.Permissions]).
const (
	OAuthClient   = "client"   // a client registered by RFC 7591
	OAuthRequest  = "req"      // a pending authorization request, by its user code
	OAuthConsent  = "consent"  // the operator's approval or denial of a request, by its user code
	OAuthCode     = "code"     // an authorization code, by its hash
	OAuthRedeemed = "redeemed" // a code redeemed: created once, by whichever replica redeems it first
	OAuthGrant    = "grant"    // a grant and its refresh-token family, by grant id
)

// ErrOAuthExists is returned, wrapped, by [OAuthStore.Create] when the key
// exists already; ErrOAuthChanged by [OAuthStore.Update] when it changed
// since it was read; ErrOAuthNotFound by [OAuthStore.Get] when there is
// none.
var (
	ErrOAuthExists   = errors.New("oauth record exists")
	ErrOAuthChanged  = errors.New("oauth record changed since it was read")
	ErrOAuthNotFound = errors.New("no such oauth record")
)

// oauthIDRe is what an id in an okso_oauth key may be: one NATS subject
// token, of characters no client can use to reach another key.
var oauthIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// OAuthOptions configure [OpenOAuth]. The zero value keeps the bucket on
// file, on one replica, and creates it when missing.
type OAuthOptions struct {
	Replicas int
	// BindOnly: the bucket must exist; it is neither created nor changed
	// (a role's NATS credential may do neither).
	BindOnly bool
}

// OAuthStore is the bucket okso_oauth: records by kind and id, each
// with a TTL, written create-only or compare-and-set so that replicas
// agree on who redeemed a code or rotated a refresh token. What the
// records say is the authorization server's (package mcp). It is safe
// for concurrent use.
type OAuthStore struct {
	nc *nats.Conn
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// OpenOAuth binds to the bucket, creating it in file storage when it does
// not exist (unless o.BindOnly): a grant must outlive a restart of NATS.
func OpenOAuth(ctx context.Context, nc *nats.Conn, o OAuthOptions) (*OAuthStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("open jetstream: %w", err)
	}
	kv, err := openKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:         BucketOAuth,
		Description:    "okso authorization server: clients, requests, codes, grants",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       max(o.Replicas, 1),
		LimitMarkerTTL: time.Minute, // per-key TTLs need it
		MaxValueSize:   64 << 10,
	}, o.BindOnly)
	if err != nil {
		return nil, err
	}
	return &OAuthStore{nc: nc, js: js, kv: kv}, nil
}

// OAuthKey is the key of the record of kind with id, or an error when id
// could reach another key.
func OAuthKey(kind, id string) (string, error) {
	if !oauthIDRe.MatchString(id) {
		return "", fmt.Errorf("oauth %s id %q: not an id okso made", kind, id)
	}
	return kind + "." + id, nil
}

// Get returns the record of kind with id and its revision, for
// [OAuthStore.Update]; [ErrOAuthNotFound] when there is none.
func (s *OAuthStore) Get(ctx context.Context, kind, id string) ([]byte, uint64, error) {
	key, err := OAuthKey(kind, id)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrOAuthNotFound, err)
	}
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, fmt.Errorf("read %s: %w", key, ErrOAuthNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", key, err)
	}
	return e.Value(), e.Revision(), nil
}

// Create writes the record of kind with id, which lives ttl, only where
// there is none: of two replicas creating one key at once, exactly one
// succeeds, the other gets [ErrOAuthExists].
func (s *OAuthStore) Create(ctx context.Context, kind, id string, value []byte, ttl time.Duration) (uint64, error) {
	key, err := OAuthKey(kind, id)
	if err != nil {
		return 0, err
	}
	rev, err := s.kv.Create(ctx, key, value, jetstream.KeyTTL(wholeSeconds(ttl)))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create %s: %w", key, ErrOAuthExists)
	}
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	return rev, nil
}

// Update replaces the record of kind with id, read at revision rev, and
// makes it live ttl from now; [ErrOAuthChanged] when another write came
// in between (then nothing is written).
func (s *OAuthStore) Update(ctx context.Context, kind, id string, value []byte, rev uint64, ttl time.Duration) (uint64, error) {
	key, err := OAuthKey(kind, id)
	if err != nil {
		return 0, err
	}
	ack, err := s.js.Publish(ctx, "$KV."+BucketOAuth+"."+key, value,
		jetstream.WithMsgTTL(wholeSeconds(ttl)), jetstream.WithExpectLastSequencePerSubject(rev))
	if wrongSequence(err) {
		return 0, fmt.Errorf("update %s: %w", key, ErrOAuthChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update %s: %w", key, err)
	}
	return ack.Sequence, nil
}

// Put writes the record of kind with id, whatever was there: for records
// one writer owns (the operator's decision on a request).
func (s *OAuthStore) Put(ctx context.Context, kind, id string, value []byte, ttl time.Duration) error {
	key, err := OAuthKey(kind, id)
	if err != nil {
		return err
	}
	if _, err := s.js.Publish(ctx, "$KV."+BucketOAuth+"."+key, value, jetstream.WithMsgTTL(wholeSeconds(ttl))); err != nil {
		return fmt.Errorf("write %s: %w", key, err)
	}
	return nil
}

// Delete removes the record of kind with id.
func (s *OAuthStore) Delete(ctx context.Context, kind, id string) error {
	key, err := OAuthKey(kind, id)
	if err != nil {
		return err
	}
	if err := s.kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List returns every live record of kind, by id. It reads them with
// direct gets (no consumer: a role may not make one), so it costs a
// read of each: for the operator's listings and the count of
// registered clients, not for a request's path.
func (s *OAuthStore) List(ctx context.Context, kind string) (map[string][]byte, error) {
	state, err := readState(ctx, s.nc, BucketOAuth, kind+".>")
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for key, e := range state {
		if e.value == nil {
			continue
		}
		if id, ok := strings.CutPrefix(key, kind+"."); ok {
			out[id] = e.value
		}
	}
	return out, nil
}

// WatchGone calls gone with the id of each record of kind deleted or
// expired while it runs, on its goroutine, until ctx ends (then it
// returns nil) or the subscription fails. It follows the bucket's
// republished messages, at most once: a record whose deletion NATS lost
// is not reported, so use it to act sooner, not as the only check.
func (s *OAuthStore) WatchGone(ctx context.Context, kind string, gone func(id string)) error {
	sub, err := s.nc.SubscribeSync(stateSubject(BucketOAuth, kind+".>"))
	if err != nil {
		return fmt.Errorf("follow kv %s: %w", BucketOAuth, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("follow kv %s: %w", BucketOAuth, err)
		}
		key, _, _, value, _, ok := republished(BucketOAuth, m)
		if !ok || value != nil {
			continue
		}
		if id, ok := strings.CutPrefix(key, kind+"."); ok {
			gone(id)
		}
	}
}

// wholeSeconds rounds a TTL up to whole seconds, at least one: NATS
// message TTLs count whole seconds.
func wholeSeconds(d time.Duration) time.Duration {
	return max((d+time.Second-1)/time.Second*time.Second, time.Second)
}
