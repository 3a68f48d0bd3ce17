package roles

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestRemotePartSubreaper: all-in-one with --remotes makes okso the
// reaper of the processes its upstreams leave behind (on Linux), so that
// they come to okso, not to init.
func TestRemotePartSubreaper(t *testing.T) {
	script, err := filepath.Abs(filepath.Join("..", "scripts", "mcp_echo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(t.TempDir(), "remotes.yaml")
	if err := os.WriteFile(config, []byte("upstreams:\n  - name: ext\n    transport: action\n    command: ["+strconv.Quote(script)+
		"]\n    tenants: [demo]\n    allow: [echo_external]\n    safety: {echo_external: read_only}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startAllInOne(t, 0, func(c *AllInOneConfig) { c.Remote.Config = config })
	f.waitTool(DefaultTenant, "ext.echo_external", true)
	var on int32
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, unix.PR_GET_CHILD_SUBREAPER, uintptr(unsafe.Pointer(&on)), 0); errno != 0 {
		t.Fatal(errno)
	}
	if on == 0 {
		t.Error("okso with --remotes is not its upstreams' orphans' reaper (PR_SET_CHILD_SUBREAPER)")
	}
}
