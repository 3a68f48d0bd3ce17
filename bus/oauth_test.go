package bus_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/okso-io/okso/bus"
)

// A code is redeemed once whichever replicas try at once: the redemption
// is a create-only write, so exactly one of many concurrent creates wins.
func TestOAuthCreateOnce(t *testing.T) {
	srv, nc := startBus(t)
	if _, err := bus.OpenOAuth(ctx(t), nc, bus.OAuthOptions{}); err != nil {
		t.Fatal(err)
	}
	const replicas = 8
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		wins int
	)
	for i := range replicas {
		s, err := bus.OpenOAuth(ctx(t), connect(t, srv, "replica"), bus.OAuthOptions{BindOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			_, err := s.Create(ctx(t), bus.OAuthRedeemed, "code-hash-1", []byte{byte('0' + i)}, time.Minute)
			switch {
			case err == nil:
				mu.Lock()
				wins++
				mu.Unlock()
			case !errors.Is(err, bus.ErrOAuthExists):
				t.Errorf("replica %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d replicas redeemed one code, want exactly 1", wins)
	}
}

// Update is compare-and-set: a write based on an old read changes nothing.
func TestOAuthUpdateCompareAndSet(t *testing.T) {
	_, nc := startBus(t)
	s, err := bus.OpenOAuth(ctx(t), nc, bus.OAuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.Create(ctx(t), bus.OAuthGrant, "g1", []byte("v1"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx(t), bus.OAuthGrant, "g1", []byte("v2"), rev, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx(t), bus.OAuthGrant, "g1", []byte("v3"), rev, time.Hour); !errors.Is(err, bus.ErrOAuthChanged) {
		t.Fatalf("update from a stale revision: %v, want ErrOAuthChanged", err)
	}
	if v, _, err := s.Get(ctx(t), bus.OAuthGrant, "g1"); err != nil || string(v) != "v2" {
		t.Fatalf("after a refused update: %q, %v; want v2", v, err)
	}
	if err := s.Delete(ctx(t), bus.OAuthGrant, "g1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx(t), bus.OAuthGrant, "g1"); !errors.Is(err, bus.ErrOAuthNotFound) {
		t.Fatalf("a deleted grant: %v, want ErrOAuthNotFound", err)
	}
	for _, id := range []string{"", "a.b", "a*", ">", "a b"} {
		if _, err := s.Create(ctx(t), bus.OAuthClient, id, []byte("x"), time.Hour); err == nil {
			t.Errorf("id %q accepted: it could name another key", id)
		}
	}
}

// List finds every live record of one kind, and only those.
func TestOAuthList(t *testing.T) {
	_, nc := startBus(t)
	s, err := bus.OpenOAuth(ctx(t), nc, bus.OAuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Create(ctx(t), bus.OAuthClient, id, []byte(id), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create(ctx(t), bus.OAuthGrant, "a", []byte("g"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx(t), bus.OAuthClient, "b"); err != nil {
		t.Fatal(err)
	}
	got, err := s.List(ctx(t), bus.OAuthClient)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || string(got["a"]) != "a" || string(got["c"]) != "c" {
		t.Fatalf("clients %q, want a and c", got)
	}
}

// Least privilege on okso_oauth: the gateway writes its records but not
// the operator's decisions; the admin writes those; no other role reads
// or writes the bucket.
func TestOAuthRoles(t *testing.T) {
	creds, err := bus.NewCredentials()
	if err != nil {
		t.Fatal(err)
	}
	seeds := t.TempDir()
	for _, r := range bus.Roles {
		b, err := creds.SeedFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(seeds, bus.SeedFileName(r)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := creds.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	url := startConfigured(t, conf)
	gw := connectRole(t, url, seeds, bus.RoleGateway)
	dev := connectRole(t, url, seeds, bus.RoleDevice)
	admin := connectRole(t, url, seeds, bus.RoleAdmin)

	if _, err := bus.OpenOAuth(ctx(t), gw.Conn, bus.OAuthOptions{BindOnly: true}); !errors.Is(err, bus.ErrNoBucket) {
		t.Fatalf("gateway before okso nats init: %v, want ErrNoBucket", err)
	}
	if err := bus.InitState(ctx(t), admin.Conn, bus.StateOptions{}); err != nil {
		t.Fatalf("admin makes the buckets: %v", err)
	}
	g, err := bus.OpenOAuth(ctx(t), gw.Conn, bus.OAuthOptions{BindOnly: true})
	if err != nil {
		t.Fatalf("gateway opens okso_oauth: %v", err)
	}
	a, err := bus.OpenOAuth(ctx(t), admin.Conn, bus.OAuthOptions{BindOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Create(ctx(t), bus.OAuthRequest, "ABCD1234", []byte(`{}`), time.Minute); err != nil {
		t.Fatalf("gateway writes a request: %v", err)
	}
	if _, err := g.Create(ctx(t), bus.OAuthCode, "h1", []byte(`{}`), time.Minute); err != nil {
		t.Fatalf("gateway writes a code: %v", err)
	}
	if err := a.Put(ctx(t), bus.OAuthConsent, "ABCD1234", []byte(`{"approved":true}`), time.Minute); err != nil {
		t.Fatalf("admin approves: %v", err)
	}
	if v, _, err := g.Get(ctx(t), bus.OAuthConsent, "ABCD1234"); err != nil || string(v) != `{"approved":true}` {
		t.Fatalf("gateway reads the decision: %q, %v", v, err)
	}
	gw.mayNotPublish(t, "$KV."+bus.BucketOAuth+"."+bus.OAuthConsent+".ABCD1234", nil)
	dev.mayNotPublish(t, "$KV."+bus.BucketOAuth+"."+bus.OAuthGrant+".g1", nil)
	dev.mayNotPublish(t, "$JS.API.DIRECT.GET.KV_"+bus.BucketOAuth, nil)
}
