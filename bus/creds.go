package bus

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/okso-io/okso/internal/secretfile"
)

// Credentials are the NATS identities of okso's roles: an nkey (a user
// seed) per [Role], and the secret with which the embedded servers of one
// cluster accept each other's routes. An embedded server started with
// them admits no one else (DESIGN.md §6); a process connects as one role
// with [Credentials.Option], or another process with the role's seed
// file ([Credentials.SeedFile], what okso nats creds prints). Credentials
// are safe for concurrent use.
type Credentials struct {
	keys        map[Role]nkeys.KeyPair
	routeSecret string
	// retired are the public keys of roles' former seeds, still admitted
	// with their role's permissions while a rotation rolls out
	// ([RotateCredential]).
	retired map[Role][]string
}

// CredentialsDir is where a data dir keeps okso's NATS credentials: one
// seed file per role (<role>.nk), the route secret (route.secret), each
// readable by its owner alone, and the public keys of rotated seeds
// (retired/<role>.<public key>.pub).
func CredentialsDir(dataDir string) string { return filepath.Join(dataDir, "nats", "creds") }

// SeedFileName is the name of role's seed file in a [CredentialsDir].
func SeedFileName(role Role) string { return string(role) + ".nk" }

const (
	routeSecretFile = "route.secret"
	retiredDir      = "retired"
)

// NewCredentials makes credentials that live in memory only: for a
// server no other process reaches.
func NewCredentials() (*Credentials, error) {
	c := &Credentials{keys: map[Role]nkeys.KeyPair{}}
	for _, r := range Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("make the %s nkey: %w", r, err)
		}
		c.keys[r] = kp
	}
	var err error
	if c.routeSecret, err = newRouteSecret(); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadCredentials reads the credentials kept in dir, making (and keeping)
// the ones missing: the first okso to start on a data dir makes them, the
// others read them. Processes that start together on one data dir agree:
// each file is written whole under a temporary name, then linked to its
// own, and the one that loses the race reads the winner's.
func LoadCredentials(dir string) (*Credentials, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("nats credentials dir: %w", err)
	}
	c := &Credentials{keys: map[Role]nkeys.KeyPair{}}
	for _, r := range Roles {
		file := filepath.Join(dir, SeedFileName(r))
		b, err := secretfile.Keep(file, func() ([]byte, error) {
			kp, err := nkeys.CreateUser()
			if err != nil {
				return nil, err
			}
			return seedFile(r, kp)
		})
		if err != nil {
			return nil, fmt.Errorf("nats credential of %s: %w", r, err)
		}
		if err := secretfile.OwnerOnly(file); err != nil {
			return nil, fmt.Errorf("nats credential of %s: %w", r, err)
		}
		kp, err := nkeys.ParseDecoratedUserNKey(b)
		if err != nil {
			return nil, fmt.Errorf("nats credential of %s: %s: %w", r, file, err)
		}
		c.keys[r] = kp
	}
	b, err := secretfile.Keep(filepath.Join(dir, routeSecretFile), func() ([]byte, error) {
		s, err := newRouteSecret()
		return []byte(s + "\n"), err
	})
	if err != nil {
		return nil, fmt.Errorf("nats route secret: %w", err)
	}
	if err := secretfile.OwnerOnly(filepath.Join(dir, routeSecretFile)); err != nil {
		return nil, fmt.Errorf("nats route secret: %w", err)
	}
	if c.routeSecret = strings.TrimSpace(string(b)); c.routeSecret == "" {
		return nil, fmt.Errorf("nats route secret: %s is empty (delete it to make a new one)", filepath.Join(dir, routeSecretFile))
	}
	if c.retired, err = loadRetired(filepath.Join(dir, retiredDir)); err != nil {
		return nil, err
	}
	return c, nil
}

// loadRetired reads the retired public keys in dir (none when it does not
// exist).
func loadRetired(dir string) (map[Role][]string, error) {
	files, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nats retired keys: %w", err)
	}
	retired := map[Role][]string{}
	for _, f := range files {
		name, ok := strings.CutSuffix(f.Name(), ".pub")
		role, pub, dot := strings.Cut(name, ".")
		r, known := ParseRole(role)
		if !ok || !dot || !known || !nkeys.IsValidPublicUserKey(pub) {
			return nil, fmt.Errorf("nats retired keys: %s is no <role>.<public key>.pub of okso's (delete it)", filepath.Join(dir, f.Name()))
		}
		retired[r] = append(retired[r], pub)
	}
	return retired, nil
}

// RotateCredential gives role a new seed in the credentials dir dir and
// keeps the old one's public key in dir/retired, so that NATS servers
// that load the credentials after this admit both: restart the servers
// (or, for a NATS okso does not embed, load okso nats server-config
// again), then the role's processes with the new seed, then delete the
// retired key and restart the servers once more. It returns the new
// public key.
func RotateCredential(dir string, role Role) (string, error) {
	c, err := LoadCredentials(dir)
	if err != nil {
		return "", err
	}
	old := c.PublicKey(role)
	if err := os.MkdirAll(filepath.Join(dir, retiredDir), 0o700); err != nil {
		return "", fmt.Errorf("nats retired keys: %w", err)
	}
	keep := filepath.Join(dir, retiredDir, string(role)+"."+old+".pub")
	if err := os.WriteFile(keep, []byte(old+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keep the old public key of %s: %w", role, err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	b, err := seedFile(role, kp)
	if err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, SeedFileName(role))); err != nil {
		return "", fmt.Errorf("replace the seed of %s: %w", role, err)
	}
	pub, _ := kp.PublicKey()
	return pub, nil
}

func newRouteSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make the nats route secret: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// seedFile is the seed file of kp, role's: the seed between the markers
// NATS tools know (nats --nkey and nats.go's NkeyOptionFromSeed read it).
func seedFile(role Role, kp nkeys.KeyPair) ([]byte, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# okso NATS credential: role %s, public key %s.\n", role, pub)
	fmt.Fprintf(&b, "# A secret: it lets its holder onto okso's NATS as %s. Give it to okso with --nats-nkey FILE.\n", role)
	fmt.Fprintf(&b, "-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", seed)
	return b.Bytes(), nil
}

// SeedFile returns role's seed file, what --nats-nkey reads.
func (c *Credentials) SeedFile(role Role) ([]byte, error) {
	kp, ok := c.keys[role]
	if !ok {
		return nil, fmt.Errorf("no nats credential of role %q", role)
	}
	return seedFile(role, kp)
}

// PublicKey returns role's public nkey.
func (c *Credentials) PublicKey(role Role) string {
	pub, _ := c.keys[role].PublicKey()
	return pub
}

// Option is the nats.go option that authenticates a connection as role.
func (c *Credentials) Option(role Role) nats.Option {
	kp := c.keys[role]
	pub, _ := kp.PublicKey()
	return nats.Nkey(pub, kp.Sign)
}

// publicKeys returns each role's public keys: the current one, then the
// retired ones.
func (c *Credentials) publicKeys() func(Role) []string {
	return func(r Role) []string { return append([]string{c.PublicKey(r)}, c.retired[r]...) }
}

// routeUser is the user name of the embedded servers' routes.
const routeUser = "okso-route"

// ServerConfig returns the accounts block of a nats-server configuration
// file that admits okso's roles, each with its permissions, and keeps
// okso's buckets in an account of their own (see [AccountsConfig]): for
// a NATS cluster okso does not embed (its servers need no seed, only the
// public keys), and for the servers okso embeds.
func (c *Credentials) ServerConfig() (string, error) {
	var b strings.Builder
	b.WriteString("# okso's roles on NATS (okso nats server-config): one nkey user per role, with its permissions,\n" +
		"# in account " + AccountRoles + "; okso's buckets in account " + AccountState + ", which no client is in.\n" +
		"# Each role's first key is its current one; a second is a retired one, until its rotation is rolled out.\n" +
		"accounts: ")
	enc := json.NewEncoder(&b) // JSON is a nats-server configuration too
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(AccountsConfig(c.publicKeys())); err != nil {
		return "", fmt.Errorf("nats server config: %w", err)
	}
	return b.String(), nil
}
