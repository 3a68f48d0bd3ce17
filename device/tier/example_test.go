package tier_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/okso-io/okso/auth"
	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/device/tier"
	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/schemas"
)

// A device tier on an embedded NATS server: devices dial its handler at
// wire.Path; Shutdown sends them away (1001) and waits for everything the
// tier started.
func ExampleNew() {
	srv, err := bus.StartServer(bus.ServerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect("okso-device-tier")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	reg, err := bus.OpenRegistry(ctx, nc, bus.RegistryOptions{})
	if err != nil {
		log.Fatal(err)
	}
	bindings, err := bus.OpenBindings(ctx, nc, bus.BindingsOptions{Registry: reg})
	if err != nil {
		log.Fatal(err)
	}
	set, err := schemas.Load()
	if err != nil {
		log.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "okso-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	signer, err := auth.LoadOrCreateSigner(dir) // mints and checks device tokens
	if err != nil {
		log.Fatal(err)
	}

	t, err := tier.New(tier.Options{NC: nc, Registry: reg, Bindings: bindings, Schemas: set,
		Verifier: auth.NewVerifier(signer.Public(), auth.AudienceDevice),
		Auditor:  &bus.Auditor{Log: slog.New(slog.DiscardHandler)}})
	if err != nil {
		log.Fatal(err)
	}
	hs := httptest.NewServer(t.Handler())
	defer hs.Close()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + wire.Path
	fmt.Println("devices dial", strings.HasSuffix(url, "/v1/device/ws"), "and", t.Sessions(), "are connected")

	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := t.Shutdown(sctx); err != nil {
		log.Fatal(err)
	}
	// Output: devices dial true and 0 are connected
}
