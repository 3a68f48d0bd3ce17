package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/internal/rawio"
	"github.com/okso-io/okso/schemas"
)

// fleetPart is a set of simulated devices.
type fleetPart struct {
	log       *slog.Logger
	devices   []*agent.Device
	watch     *linkWatch    // says when the tier goes away and comes back
	links     []*deviceLink // each device's, in watch
	client    *http.Client  // every device dials with it
	connected atomic.Int64  // devices that got their first announce_ok
	refused   atomic.Int64  // devices a tier refused for good
	// rate is how many devices start dialling per second (0: all at once).
	rate int
}

// fleetOptions are how a fleet's devices dial, and what they serve: TLS,
// the client config of wss:// URLs (nil: the system's roots), and Source,
// the local address they dial from (nil: the system's choice). One source
// address reaches
// one tier port from at most ~28,000 ephemeral ports: a larger fleet on
// one host is several fleets, each from its own loopback address.
type fleetOptions struct {
	TLS    *tls.Config
	Source net.IP
	// Tools are local tools every device serves (mock-fleet --tools):
	// one list, shared read-only by the fleet.
	Tools []agent.LocalTool
}

// client is the one HTTP client every device of the fleet dials with,
// with a device's dialer (agent.NewDialer).
func (d *fleetOptions) client() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	dialer := agent.NewDialer(0)
	t.DialContext = rawio.Dial(dialer)
	if d == nil {
		return &http.Client{Transport: t}
	}
	t.TLSClientConfig = d.TLS
	if d.Source != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: d.Source}
	}
	return &http.Client{Transport: t}
}

// newFleetPart makes n simulated devices of tenant dialling urls as dial
// says (nil: the defaults). The first devices
// are the nodes ids, if given; the others get node ids derived from the
// data dir's mock key, kind, tenant and seed ([mockNodeIDs]), the same at
// each start.
func newFleetPart(c *common, kind fleetKind, n int, tenant string, urls []string, dial *fleetOptions, seed uint64, ids ...string) (*fleetPart, error) {
	if !schemas.ValidTenant(tenant) {
		return nil, fmt.Errorf("tenant %q: use 1-64 letters, digits, _ or -", tenant)
	}
	f := &fleetPart{log: c.log.With("role", "mock-fleet")}
	f.watch = newLinkWatch(f.log, fleetLinkWindow)
	if n > 0 && c.signer == nil {
		return nil, errors.New("simulated devices need the signing key (signing.key) in the data dir")
	}
	derived, err := mockNodeIDs(c.dataDir, kind, tenant, seed, len(ids), n)
	if err != nil {
		return nil, err
	}
	ids = append(ids[:len(ids):len(ids)], derived...)
	f.client = dial.client()
	for i, id := range ids[:n] {
		tok, err := c.signer.Mint(auth.MintOptions{
			Subject: id, Tenant: tenant, Scopes: []string{auth.ScopeDeviceConnect},
			Audience: auth.AudienceDevice, TTL: 365 * 24 * time.Hour,
		})
		if err != nil {
			return nil, err
		}
		o := agent.MockOptions(id, c.schemas, seed)
		o.URLs, o.HTTPClient, o.Token, o.Logger = urls, f.client, tok, f.log
		if dial != nil && len(dial.Tools) > 0 {
			if o, err = agent.WithLocalTools(o, dial.Tools); err != nil {
				return nil, err
			}
		}
		o.Name, o.Labels = mockName(i), mockLabels(i)
		var once sync.Once
		link := f.watch.add()
		o.OnReady = func([]string) {
			once.Do(func() { f.connected.Add(1) })
			link.ready()
		}
		o.OnLost, o.OnFail = link.lost, link.failed
		d, err := agent.New(o)
		if err != nil {
			return nil, err
		}
		f.devices = append(f.devices, d)
		f.links = append(f.links, link)
	}
	return f, nil
}

// mockName is the name of the i-th simulated device of a fleet. Fleets
// share names (each has a mock-0): a name is for people and filters, the
// node id is the identity.
func mockName(i int) string { return "mock-" + strconv.Itoa(i) }

// mockLabels are the labels of the i-th simulated device of a fleet:
// fleet=mock on all, and a zone of three taken in turn (a, b, c), so
// that a fleet filter has something to choose among.
func mockLabels(i int) map[string]string {
	return map[string]string{"fleet": "mock", "zone": string(rune('a' + i%3))}
}

func (f *fleetPart) actors(g *run.Group) {
	if len(f.devices) == 0 {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		var wg sync.WaitGroup
		wg.Go(func() { f.progress(ctx) })
		var pace <-chan time.Time
		if f.rate > 0 && len(f.devices) > f.rate {
			t := time.NewTicker(time.Second / time.Duration(f.rate))
			defer t.Stop()
			pace = t.C
		}
	start:
		for i, d := range f.devices {
			if pace != nil {
				select {
				case <-ctx.Done():
					break start
				case <-pace:
				}
			}
			wg.Go(func() {
				if err := d.Run(ctx); err != nil {
					// A fleet's devices are refused alike (a token of
					// another key): the first says why, the progress line
					// counts them all.
					if f.refused.Add(1) == 1 {
						f.log.Error("mock device stopped", "node_id", d.NodeID(), "err", err)
					} else {
						f.log.Debug("mock device stopped", "node_id", d.NodeID(), "err", err)
					}
					f.links[i].refused()
				}
			})
		}
		<-ctx.Done() // a device that gave up does not stop the role
		wg.Wait()
		f.client.CloseIdleConnections() // of dials that got no upgrade
		f.watch.stop()
		return nil
	})
}

// progress logs how many devices are connected, every second until all
// are, then once more with the time it took.
func (f *fleetPart) progress(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	n := int64(len(f.devices))
	for {
		if c := f.connected.Load(); c == n {
			f.log.Info("mock devices connected", "count", n, "elapsed", time.Since(start).Round(time.Millisecond).String())
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c := f.connected.Load(); c < n { // else the line above, at once
				args := []any{"connected", c, "of", n}
				if r := f.refused.Load(); r > 0 {
					args = append(args, "refused", r)
				}
				if failing, why := f.watch.failing(); failing > 0 {
					args = append(args, "failing", failing, "err", why)
				}
				f.log.Info("mock devices connecting", args...)
			}
		}
	}
}
