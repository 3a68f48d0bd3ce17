package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/oklog/run"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/device/agent"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// agentPart is the real device agent of this host.
type agentPart struct {
	log   *slog.Logger
	d     *agent.Device
	link  *deviceLink
	watch *linkWatch
	// claim is the data dir's hold on the node; nil when the node is its
	// --token's.
	claim *nodeClaim
	// endsRole: a replaced agent ends its role (okso agent, which has
	// nothing else to serve), rather than wait for it to end.
	endsRole bool

	stopDevice context.CancelFunc // set before d runs
	replaced   atomic.Bool        // its node was taken from it
	gaveUp     sync.Once
}

// agentSpec is what makes an agent: where it dials and how, who it is,
// and what it serves besides echo and metrics.
type agentSpec struct {
	urls    []string
	tls     *tls.Config
	token   string
	dataDir string
	tenant  string
	nodeID  string
	name    string
	labels  map[string]string
	replace bool
	tools   []agent.LocalTool // the device's own (--tools)
}

// newAgentPart builds the agent. With a token, the node id is the token's
// subject; without, it mints a device token with the data dir's key for a
// node id kept in the data dir, so this host keeps its node id, and holds
// that node in the data dir (a nodeClaim; replace takes it over).
// spec.tls is for wss:// URLs (nil: the system's roots). spec.nodeID, if
// set, is the node id of the minted token (that of a client certificate).
//
// spec.name and spec.labels are the agent's own (--name, --label); name ""
// is the host's ([agent.HostName]). spec.replace takes the data dir's node
// over from another process serving it (--replace).
func newAgentPart(c *common, spec agentSpec) (_ *agentPart, err error) {
	token := spec.token
	var claim *nodeClaim
	var id string
	if token != "" {
		var err error
		if id, err = auth.UnverifiedSubject(token); err != nil {
			return nil, fmt.Errorf("--token: %w", err)
		}
		if !schemas.ValidNodeID(id) {
			return nil, fmt.Errorf("--token: its subject %q is not a node id", id)
		}
	} else {
		var err error
		if id = spec.nodeID; id == "" {
			if id, err = hostNodeID(spec.dataDir); err != nil {
				return nil, err
			}
		}
		if token, err = c.signer.Mint(auth.MintOptions{Subject: id, Tenant: spec.tenant,
			Scopes: []string{auth.ScopeDeviceConnect}, Audience: auth.AudienceDevice, TTL: 365 * 24 * time.Hour}); err != nil {
			return nil, err
		}
		if claim, err = claimNode(c.log, spec.dataDir, id, spec.replace); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				claim.release()
			}
		}()
	}
	log := c.log.With("role", "agent", "node_id", id)
	watch := newLinkWatch(log, 0) // one device: say it at once
	a := &agentPart{log: log, link: watch.add(), watch: watch, claim: claim}
	o := agent.HostOptions(id, c.schemas, Version)
	o.URLs, o.TLS, o.Token, o.Logger = spec.urls, spec.tls, token, log
	if spec.name != "" {
		o.Name = spec.name
	}
	o.Labels = spec.labels
	if o, err = agent.WithLocalTools(o, spec.tools); err != nil {
		return nil, err
	}
	connected := false // OnReady is called in turn, from Run's goroutine
	o.OnReady = func(tools []string) {
		if connected {
			a.link.ready() // "device tier back", if it was lost
			return
		}
		connected = true
		// One line, also when it ends the outage of a tier that was not
		// up yet: "agent connected", not that and "device tier back".
		a.link.readyAs("agent connected", "tools", len(tools))
	}
	o.OnLost = func(err error) {
		if !a.giveUp(err) {
			a.link.lost(err)
		}
	}
	o.OnFail = func(err error) {
		if !a.giveUp(err) {
			a.link.failed(err)
		}
	}
	if a.d, err = agent.New(o); err != nil {
		return nil, err
	}
	return a, nil
}

// giveUp stops the agent when its node was taken from it: the tier
// closed its session for a newer one of the node (4409), or another
// process marked the data dir's node as its own (--replace). It is
// called from d.Run's hooks, after a connection ended for err, so that
// the device tries no more.
func (a *agentPart) giveUp(err error) bool {
	var ce websocket.CloseError
	if c, ok := a.claim.takenOver(); ok {
		a.takenOver(fmt.Sprintf("process %d took it over (--replace)", c.PID))
	} else if errors.As(err, &ce) && ce.Code == wire.CloseReplaced {
		a.takenOver("the device tier closed its session for a newer session of the node (4409)")
	} else {
		return false
	}
	return true
}

// watchClaim stops the agent when another process marks the data dir's
// node as its own while the agent is connected: the two may be on tiers
// of different NATS, where no 4409 tells. It looks once a second until
// ctx ends.
func (a *agentPart) watchClaim(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c, ok := a.claim.takenOver(); ok {
				a.takenOver(fmt.Sprintf("process %d took it over (--replace)", c.PID))
				return
			}
		}
	}
}

// takenOver stops the agent serving its node, saying why once: coming
// back would take the node back in turn, every backoff.
func (a *agentPart) takenOver(why string) {
	a.gaveUp.Do(func() {
		args := []any{"reason", why}
		if a.claim != nil {
			args = append(args, "data_dir", a.claim.dir)
		}
		a.log.Warn("node taken over: this agent stops serving it", args...)
		a.replaced.Store(true)
		a.stopDevice()
	})
}

// hostNodeID reads this host's node id from the data dir, creating it once.
func hostNodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "agent-node-id")
	if b, err := os.ReadFile(path); err == nil {
		id := strings.TrimSpace(string(b))
		if !schemas.ValidNodeID(id) {
			return "", fmt.Errorf("%s: not a node id", path)
		}
		return id, nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", fmt.Errorf("create data dir: %w", err)
	}
	id := wire.NewNodeID()
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write agent node id: %w", err)
	}
	return id, nil
}

func (a *agentPart) actors(g *run.Group) {
	if a == nil {
		return
	}
	contextActor(g, func(ctx context.Context) error {
		defer a.claim.release()
		dctx, stop := context.WithCancel(ctx)
		defer stop()
		a.stopDevice = stop
		var claiming sync.WaitGroup
		if a.claim != nil {
			if !a.claim.held() {
				claiming.Go(func() { a.claim.hold(dctx) })
			}
			claiming.Go(func() { a.watchClaim(dctx) })
		}
		err := a.d.Run(dctx)
		stop()
		claiming.Wait()
		switch {
		case err != nil:
			a.log.Error("agent stopped", "err", err)
			a.link.refused()
		case a.replaced.Load():
			a.link.refused()
			a.claim.release() // now: the process taking over waits for it
			if a.endsRole {
				a.watch.stop()
				return nil
			}
		}
		<-ctx.Done() // an agent that was refused does not stop its role
		a.watch.stop()
		return nil
	})
}

// close lets go of what newAgentPart took, for an agent that never runs.
func (a *agentPart) close() {
	if a != nil {
		a.claim.release()
	}
}
