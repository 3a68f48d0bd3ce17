// Package ids draws the ULIDs okso puts on its hot paths.
package ids

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/oklog/ulid/v2"
)

// New returns a fresh ULID, upper case: the time in Unix milliseconds and
// 80 random bits. Unlike ulid.Make, whose entropy sits behind a lock and
// whose ULID escapes to the heap through an io.Reader, it costs one
// allocation (the string); ids of the same millisecond are unique but not
// ordered.
func New() string {
	var u ulid.ULID
	_ = u.SetTime(ulid.Now()) // errs only past the year 10889
	binary.BigEndian.PutUint64(u[6:], rand.Uint64())
	binary.BigEndian.PutUint16(u[14:], uint16(rand.Uint64()))
	return u.String()
}
