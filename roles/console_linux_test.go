package roles

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/okso-io/okso/bus"
	"github.com/okso-io/okso/internal/terminal"
)

// openPTY opens a pseudo-terminal: what is written on tty is read from
// ptmx. Both stay in Go's poller, so closing one ends a read on it.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	rc, err := ptmx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var (
		n      uint32
		unlock int32
		errno  syscall.Errno
	)
	err = rc.Control(func(fd uintptr) {
		if _, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
			return
		}
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n)))
	})
	if err != nil || errno != 0 {
		ptmx.Close()
		t.Fatalf("set up /dev/ptmx: %v %v", err, errno)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		ptmx.Close()
		t.Skipf("open the terminal of /dev/ptmx: %v", err)
	}
	return ptmx, tty
}

// TestConsoleOnATerminal runs `okso all-in-one` with its stderr on a
// terminal, as a person starts it: the log is text, and a call's audit
// events go to NATS but not to the terminal. --log-audit brings them back.
func TestConsoleOnATerminal(t *testing.T) {
	for _, withAudit := range []bool{false, true} {
		t.Run(fmt.Sprintf("log-audit %v", withAudit), func(t *testing.T) {
			ptmx, tty := openPTY(t)
			term := newLogSink()
			read := make(chan struct{})
			go func() { defer close(read); _, _ = io.Copy(term, ptmx) }()
			defer func() { _ = tty.Close(); _ = ptmx.Close(); <-read }()
			if !terminal.Is(tty) {
				t.Fatalf("%s is no terminal to terminal.Is", tty.Name())
			}

			data := t.TempDir()
			args := []string{"all-in-one", "--data-dir", data, "--mcp-addr", "127.0.0.1:0",
				"--device-addr", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--mock", "1", "--local-agent=false"}
			if withAudit {
				args = append(args, "--log-audit")
			}
			stdout := newLogSink()
			stop := runRoot(t, stdout, tty, args...)
			bannerRow(t, stdout, "logs")
			nc, err := bus.ConnectURL(bannerRow(t, stdout, "NATS"), "test-audit", bus.ClientOptions{Role: bus.RoleAudit,
				NkeyFile: filepath.Join(bus.CredentialsDir(data), bus.SeedFileName(bus.RoleAudit))})
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			onBus, err := nc.SubscribeSync("okso.v1.audit.>")
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			term.waitText(t, "the mock device on the terminal", func(l string) bool {
				return strings.Contains(l, `msg="mock devices connected"`)
			})
			s := mcpSession(t, bannerRow(t, stdout, "MCP endpoint"), bannerRow(t, stdout, "agent token"))
			echo := toolsOf(t, s, ".echo.invoke")
			if len(echo) != 1 {
				t.Fatalf("echo tools %v, want one", echo)
			}
			res, err := s.CallTool(t.Context(), &sdk.CallToolParams{Name: echo[0], Arguments: map[string]any{"message": "hi"}})
			if err != nil || res.IsError {
				t.Fatalf("echo: %v %+v", err, res)
			}
			for allowed := map[string]bool{}; !allowed["gateway"] || !allowed["tier"]; {
				m, err := onBus.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatalf("the call's audit events were not published: %v", err)
				}
				var e bus.AuditEvent
				if json.Unmarshal(m.Data, &e) == nil && listedName(e.Tool) == echo[0] && e.Decision == bus.DecisionAllowed {
					allowed[e.Actor] = true
				}
			}

			// Once okso has stopped, all it wrote is on the terminal before
			// what the test writes after it.
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if _, err := tty.WriteString("END\n"); err != nil {
				t.Fatal(err)
			}
			term.waitText(t, "the end", func(l string) bool { return l == "END" })
			audits := 0
			for _, l := range term.textLines() {
				if l == "END" {
					break
				}
				if !strings.HasPrefix(l, "time=") || !strings.Contains(l, " msg=") {
					t.Errorf("not a text log line on the terminal: %q", l)
				}
				if strings.Contains(l, " msg=audit ") {
					audits++
				}
			}
			if withAudit && audits < 2 {
				t.Errorf("%d audit lines with --log-audit, want the call's two at least:\n%s", audits, term)
			}
			if !withAudit && audits != 0 {
				t.Errorf("%d audit lines on the terminal, want none:\n%s", audits, term)
			}
		})
	}
}
