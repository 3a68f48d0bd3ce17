package roles

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/okso-io/okso/device/wire"
	"github.com/okso-io/okso/internal/secretfile"
)

// fleetKind tells apart the fleets of simulated devices whose node ids
// are derived ([mockNodeIDs]): all-in-one's --mock devices, a device
// tier's and okso mock-fleet's, on one data dir and seed, never share a
// node id.
type fleetKind string

const (
	fleetAllInOne fleetKind = "all-in-one"
	fleetDevice   fleetKind = "device"
	fleetMock     fleetKind = "mock-fleet"
)

// mockKeyFile, in the data dir, is the secret from which the simulated
// devices' node ids are derived: delete it, and they all change.
const mockKeyFile = "mock-nodes.key"

// mockNodeIDs returns the node ids of devices from to n-1 of a fleet of
// kind: a keyed hash (HMAC-SHA256 under the data dir's mock key, made on
// first use) of kind, tenant, seed and the device's index. A fleet
// restarted on the same data dir and seed gets the same node ids, so the
// tool names an agent host saved (they hold the node id) still work;
// another data dir or seed gets others, so two fleets on one data dir
// need different seeds. The key keeps them unguessable from the seed.
func mockNodeIDs(dataDir string, kind fleetKind, tenant string, seed uint64, from, n int) ([]string, error) {
	if from >= n {
		return nil, nil
	}
	key, err := mockKey(dataDir)
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	ids := make([]string, 0, n-from)
	for i := from; i < n; i++ {
		m.Reset()
		// Kind and tenant hold no NUL (tenants are letters, digits, _ and
		// -): no two of them read alike.
		fmt.Fprintf(m, "okso mock node id\x00%s\x00%s\x00", kind, tenant)
		m.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, seed), uint64(i)))
		var e [10]byte
		copy(e[:], m.Sum(nil))
		ids = append(ids, wire.DerivedNodeID(e))
	}
	return ids, nil
}

// mockKey reads the mock key of dataDir, making it on first use.
func mockKey(dataDir string) ([]byte, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	file := filepath.Join(dataDir, mockKeyFile)
	b, err := secretfile.Keep(file, func() ([]byte, error) { return []byte(rand.Text() + "\n"), nil })
	if err != nil {
		return nil, fmt.Errorf("key of the mock node ids: %w", err)
	}
	if err := secretfile.OwnerOnly(file); err != nil {
		return nil, fmt.Errorf("key of the mock node ids: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if len(key) < 16 {
		return nil, fmt.Errorf("key of the mock node ids: %s is too short (delete it to make a new one; the mock devices' node ids change)", file)
	}
	return []byte(key), nil
}
