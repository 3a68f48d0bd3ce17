package tiertest

import (
	"log/slog"
	"strings"
	"testing"
)

// TestAuditLog: the log splits what it is written into entries, finds
// with Wait one written from another goroutine, keeps whole lines only
// once asked to, and never takes a field of a line for the line itself.
func TestAuditLog(t *testing.T) {
	a := newAuditLog()
	log := slog.New(slog.NewJSONHandler(a, nil))
	log.Info("audit", "decision", "allowed", "node_id", "n1", "raw", "not the line")
	if _, err := a.Write([]byte("{\"decision\":\"denied\",\"node_id\":\"n2\"}\n{\"decision\":\"denied\",\"node_id\":\"n3\"}\n")); err != nil {
		t.Fatal(err)
	}
	a.KeepRaw()
	done := make(chan struct{})
	go func() {
		defer close(done)
		log.Info("audit", "decision", "allowed", "node_id", "n4")
	}()
	e := a.Wait(t, func(e AuditEntry) bool { return e.NodeID == "n4" })
	<-done
	if e.Decision != "allowed" || !strings.HasPrefix(e.Raw, "{") || !strings.Contains(e.Raw, `"node_id":"n4"`) {
		t.Errorf("entry %+v, want allowed for n4 with its whole line", e)
	}
	if n := a.Count(func(e AuditEntry) bool { return e.Decision == "denied" }); n != 2 {
		t.Errorf("%d denied entries, want 2", n)
	}
	all := a.Entries()
	if len(all) != 4 || all[0].NodeID != "n1" || all[0].Raw != "" {
		t.Errorf("entries %+v, want n1 to n4, n1 without its line", all)
	}
	if _, err := a.Write([]byte("not json\n")); err == nil {
		t.Error("Write took a line that is not JSON")
	}
}
