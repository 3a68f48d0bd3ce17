package roles

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/mcp"
)

// OAuthKeyDir is the directory, inside a data dir, of okso's
// authorization server's signing key: its own, never okso's signing.key
// (which mints device tokens), so a gateway needs only that one and
// signing.pub. Replicas behind one URL share it (copy it with the rest).
const OAuthKeyDir = "oauth"

// oauthConfig is okso's own authorization server (--oauth-server).
type oauthConfig struct {
	Server     bool
	MaxClients int
	AccessTTL  time.Duration
	// CIMDAllowLoopback admits client metadata documents on 127.0.0.1:
	// tests only (a hidden flag).
	CIMDAllowLoopback bool
	// CIMDTLS, when set, is how client metadata documents are fetched
	// (tests trust their server with it).
	CIMDTLS *tls.Config
}

func addOAuthFlags(fs *pflag.FlagSet, c *oauthConfig, on bool) {
	fs.BoolVar(&c.Server, "oauth-server", on, "serve okso's own OAuth authorization server next to /mcp (sign-in approved by the operator: okso oauth approve)")
	fs.IntVar(&c.MaxClients, "oauth-max-clients", 1000, "clients that may register (RFC 7591) at once with --oauth-server")
	fs.DurationVar(&c.AccessTTL, "oauth-access-ttl", time.Hour, "life of an access token of --oauth-server")
	fs.BoolVar(&c.CIMDAllowLoopback, "oauth-cimd-allow-loopback", false, "fetch client metadata documents from 127.0.0.1 too (for tests only)")
	_ = fs.MarkHidden("oauth-cimd-allow-loopback")
}

// newOAuthServer opens the authorization server's bucket and key.
func newOAuthServer(ctx context.Context, c *common, nc *nats.Conn, np *natsPart, cfg oauthConfig, audit *bus.Auditor) (*mcp.OAuthServer, error) {
	store, err := whileJetStreamForms(ctx, c.log, nc, func(ctx context.Context) (*bus.OAuthStore, error) {
		return bus.OpenOAuth(ctx, nc, bus.OAuthOptions{Replicas: np.replicas, BindOnly: np.bindOnly()})
	})
	if err != nil {
		return nil, err
	}
	signer, err := auth.LoadOrCreateSigner(filepath.Join(c.dataDir, OAuthKeyDir))
	if err != nil {
		return nil, fmt.Errorf("the authorization server's key: %w", err)
	}
	return mcp.NewOAuthServer(mcp.OAuthServerOptions{
		Store:      store,
		Signer:     signer,
		AccessTTL:  cfg.AccessTTL,
		MaxClients: cfg.MaxClients,
		CIMD:       mcp.CIMDOptions{AllowLoopback: cfg.CIMDAllowLoopback, TLS: cfg.CIMDTLS},
		Auditor:    audit,
		Logger:     c.log.With("role", "gateway", "part", "oauth"),
	})
}

// oauthCmd is okso oauth: the operator's side of okso's authorization
// server, with the admin's NATS credential.
func oauthCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "oauth", Short: "Approve, deny and revoke sign-ins to okso's own OAuth server (--oauth-server)"}
	admin := &adminFlags{of: "gateways"}
	flags := admin.add
	// with runs do with the bucket, on the admin's connection.
	with := func(cmd *cobra.Command, do func(context.Context, *nats.Conn, *bus.OAuthStore) error) error {
		ctx, nc, because, done, err := admin.session(cmd, "okso-oauth", "decide sign-ins")
		if err != nil {
			return err
		}
		defer done()
		st, err := bus.OpenOAuth(ctx, nc, bus.OAuthOptions{BindOnly: true})
		if err == nil {
			err = do(ctx, nc, st)
		}
		return because(err)
	}
	userCode := func(s string) (string, error) {
		code, ok := mcp.NormalizeUserCode(s)
		if !ok {
			return "", fmt.Errorf("%q is not a request code (8 letters and digits, as the sign-in page shows, e.g. BCDF-2345)", s)
		}
		return code, nil
	}

	var (
		tenant string
		scopes []string
	)
	approve := &cobra.Command{
		Use:   "approve CODE --tenant T --scope S",
		Short: "Approve the sign-in request whose code its page shows, for a tenant and scopes",
		Long: "okso oauth approve lets the client of a pending sign-in request (its page shows the code)\n" +
			"call the tenant's tools with the scopes given. Check on the page that the client is the one\n" +
			"you expect. The client gets its token when its user presses Continue.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := userCode(args[0])
			if err != nil {
				return err
			}
			return with(cmd, func(ctx context.Context, _ *nats.Conn, st *bus.OAuthStore) error {
				req, err := mcp.DecideOAuthRequest(ctx, st, code, mcp.OAuthDecision{
					Approved: true, Tenant: tenant, Scope: strings.Join(scopes, " "), At: time.Now().UTC(),
				})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(stdout, "approved %s: client %s, tenant %s, scope %s\n",
					mcp.ShowUserCode(code), clientLabel(req), tenant, strings.Join(scopes, " "))
				return err
			})
		},
	}
	flags(approve)
	approve.Flags().StringVar(&tenant, "tenant", "", "the tenant whose tools the client may call")
	approve.Flags().StringSliceVar(&scopes, "scope", nil, "scopes granted: "+auth.ScopeReadOnly+", "+auth.ScopeMutating+" or "+auth.ScopeDestructive+" (repeatable)")
	_ = approve.MarkFlagRequired("tenant")
	_ = approve.MarkFlagRequired("scope")

	deny := &cobra.Command{
		Use:   "deny CODE",
		Short: "Deny a sign-in request: its client gets access_denied",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			code, err := userCode(args[0])
			if err != nil {
				return err
			}
			return with(cmd, func(ctx context.Context, _ *nats.Conn, st *bus.OAuthStore) error {
				req, err := mcp.DecideOAuthRequest(ctx, st, code, mcp.OAuthDecision{At: time.Now().UTC()})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(stdout, "denied %s: client %s\n", mcp.ShowUserCode(code), clientLabel(req))
				return err
			})
		},
	}
	flags(deny)

	var client string
	revoke := &cobra.Command{
		Use:   "revoke [GRANT] [--client ID]",
		Short: "Revoke a grant (its refresh tokens at once, its access tokens within a second), or every grant of a client and the client",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == (client != "") {
				return errors.New("give a grant id or --client, one of them (okso oauth list shows them)")
			}
			return with(cmd, func(ctx context.Context, nc *nats.Conn, st *bus.OAuthStore) error {
				revs, err := bus.OpenRevocations(ctx, nc, bus.RevocationOptions{Replicas: 1})
				if err != nil {
					return err
				}
				grants := args
				if client != "" {
					all, err := mcp.OAuthGrants(ctx, st)
					if err != nil {
						return err
					}
					grants = nil
					for id, g := range all {
						if g.ClientID == client {
							grants = append(grants, id)
						}
					}
				}
				for _, id := range grants {
					g, err := mcp.RevokeOAuthGrant(ctx, st, revs, id)
					if errors.Is(err, bus.ErrOAuthNotFound) {
						return fmt.Errorf("no grant %s (revoked or expired already?)", id)
					}
					if err != nil {
						return err
					}
					fmt.Fprintf(stdout, "revoked grant %s: client %s, tenant %s (%d access tokens)\n", id, g.ClientID, g.Tenant, len(g.Access))
				}
				if client != "" {
					if err := st.Delete(ctx, bus.OAuthClient, client); err != nil && !strings.HasPrefix(client, "https://") {
						return err
					}
					fmt.Fprintf(stdout, "removed client %s: it must register again\n", client)
				}
				return nil
			})
		},
	}
	flags(revoke)
	revoke.Flags().StringVar(&client, "client", "", "revoke every grant of this client, and remove its registration")

	list := &cobra.Command{
		Use:   "list",
		Short: "List the live grants, the pending sign-in requests and the number of registered clients",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, func(ctx context.Context, _ *nats.Conn, st *bus.OAuthStore) error {
				grants, err := mcp.OAuthGrants(ctx, st)
				if err != nil {
					return err
				}
				ids := make([]string, 0, len(grants))
				for id := range grants {
					ids = append(ids, id)
				}
				sort.Strings(ids)
				for _, id := range ids {
					g := grants[id]
					fmt.Fprintf(stdout, "grant %s client %s tenant %s scope %q refreshed %s\n", id, g.ClientID, g.Tenant, g.Scope, g.Refreshed.Format(time.RFC3339))
				}
				reqs, err := st.List(ctx, bus.OAuthRequest)
				if err != nil {
					return err
				}
				codes := make([]string, 0, len(reqs))
				for code := range reqs {
					codes = append(codes, code)
				}
				sort.Strings(codes)
				for _, code := range codes {
					if req, _, err := mcp.ReadOAuthRequest(ctx, st, code); err == nil {
						fmt.Fprintf(stdout, "pending %s client %s asks %q until %s\n", mcp.ShowUserCode(code), clientLabel(req),
							req.Scope, req.Expires.Format(time.RFC3339))
					}
				}
				clients, err := st.List(ctx, bus.OAuthClient)
				if err != nil {
					return err
				}
				fmt.Fprintf(stdout, "%d grants, %d pending requests, %d registered clients\n", len(grants), len(codes), len(clients))
				return nil
			})
		},
	}
	flags(list)
	cmd.AddCommand(approve, deny, revoke, list)
	return cmd
}

// clientLabel names a request's client for the operator.
func clientLabel(req *mcp.OAuthRequest) string {
	if req.ClientName != "" {
		return fmt.Sprintf("%q (%s)", req.ClientName, req.ClientID)
	}
	return req.ClientID
}
