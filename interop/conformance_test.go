package interop

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// expectedFile says what okso must do in each scenario of the official
// conformance suite.
const expectedFile = "conformance-expected.json"

// expectations is conformance-expected.json: the suite's version, and per
// protocol revision, per scenario, what okso must do.
type expectations struct {
	About     string                            `json:"about"`
	Suite     string                            `json:"suite"`
	Revisions map[string]map[string]expectation `json:"revisions"`
}

// expectation is what okso must do in one scenario (or one check of it):
// "pass" (no check fails), or "not_applicable" (the scenario needs what
// okso does not have, such as the suite's own fixture tools, and fails
// for it: Reason says why). A scenario may instead give Checks, each
// judged on its own; its checks not listed must not fail. OksoBug marks a
// "pass" that okso does not meet yet.
type expectation struct {
	Expect  string                 `json:"expect"`
	Reason  string                 `json:"reason,omitempty"`
	OksoBug string                 `json:"okso_bug,omitempty"`
	Note    string                 `json:"note,omitempty"` // why a pass is a pass, where it is not plain
	Checks  map[string]expectation `json:"checks,omitempty"`
}

// UnmarshalJSON takes "pass" for {"expect": "pass"}, and refuses a member
// it does not know (a misspelt "reason" would go unread).
func (e *expectation) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*e = expectation{Expect: s}
		return e.valid()
	}
	type plain expectation
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode((*plain)(e)); err != nil {
		return err
	}
	return e.valid()
}

func (e *expectation) valid() error {
	switch {
	case e.Expect != "pass" && e.Expect != "not_applicable":
		return fmt.Errorf("expect %q: want pass or not_applicable", e.Expect)
	case e.Expect == "not_applicable" && e.Reason == "":
		return fmt.Errorf("not_applicable without a reason")
	case e.Expect == "not_applicable" && len(e.Checks) > 0:
		return fmt.Errorf("not_applicable with checks")
	}
	return nil
}

// check is one check of a scenario, as the suite writes it in checks.json.
type check struct {
	ID           string `json:"id"`
	Status       string `json:"status"` // SUCCESS, FAILURE, WARNING, SKIPPED, INFO
	ErrorMessage string `json:"errorMessage"`
}

func (c check) failed() bool { return c.Status == "FAILURE" }

// TestConformance runs the official conformance suite's server scenarios
// against all-in-one, for each protocol revision it requires, and checks
// each scenario's outcome against conformance-expected.json.
//
// The suite sends no bearer token; a reverse proxy in front of the
// gateway adds the agent token's Authorization header and changes nothing
// else (the Host header included: the suite's DNS-rebinding checks are
// about it).
func TestConformance(t *testing.T) {
	o := startOkso(t, 2)
	nm := nodeModules(t)
	want := readExpectations(t)
	var pkg struct {
		Version string `json:"version"`
	}
	if b, err := os.ReadFile(filepath.Join(nm, "@modelcontextprotocol", "conformance", "package.json")); err != nil {
		t.Fatal(err)
	} else if err := json.Unmarshal(b, &pkg); err != nil {
		t.Fatal(err)
	}
	if got := "@modelcontextprotocol/conformance@" + pkg.Version; got != want.Suite {
		t.Fatalf("%s was written for %s, the suite installed is %s: run it again and review each scenario", expectedFile, want.Suite, got)
	}

	proxy := authProxy(t, o.mcpURL, o.token)
	for _, rev := range slices.Sorted(maps.Keys(want.Revisions)) {
		t.Run(rev, func(t *testing.T) {
			results := runConformance(t, proxy, rev)
			judge(t, want.Revisions[rev], results)
		})
	}
}

func readExpectations(t *testing.T) expectations {
	t.Helper()
	b, err := os.ReadFile(expectedFile)
	if err != nil {
		t.Fatal(err)
	}
	var e expectations
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&e); err != nil {
		t.Fatalf("%s: %v", expectedFile, err)
	}
	return e
}

// authProxy serves a reverse proxy of the MCP endpoint that adds a bearer
// token to every request, and returns its MCP URL.
func authProxy(t *testing.T, mcpURL, token string) string {
	t.Helper()
	target, err := url.Parse(mcpURL)
	if err != nil {
		t.Fatal(err)
	}
	origin := &url.URL{Scheme: target.Scheme, Host: target.Host}
	tr := &http.Transport{}
	slow := &slowLog{base: tr}
	srv := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(origin)
			r.Out.Host = r.In.Host
			r.Out.Header.Set("Authorization", "Bearer "+token)
		},
		Transport:     slow,
		FlushInterval: -1, // SSE
	})
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
		if t.Failed() {
			t.Logf("requests okso took over %v to answer, or did not:\n%s", slowAnswer, slow)
		}
	})
	return srv.URL + target.Path
}

// slowAnswer is how long an answer may take before slowLog notes it.
const slowAnswer = 5 * time.Second

// slowLog is a RoundTripper that notes each request whose answer's
// headers took over slowAnswer to come, or never came: what a failed
// test says of a request okso left hanging. It is safe for concurrent
// use.
type slowLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	log  strings.Builder
}

func (s *slowLog) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	start := time.Now()
	res, err := s.base.RoundTrip(r)
	if took := time.Since(start); took > slowAnswer || err != nil {
		status := "no answer: " + fmt.Sprint(err)
		if err == nil {
			status = res.Status
		}
		s.mu.Lock()
		fmt.Fprintf(&s.log, "%s %s after %v (%s), Mcp-Method %q, Mcp-Name %q, Mcp-Protocol-Version %q, body %.300s\n",
			start.Format("15:04:05.000"), r.Method, took.Round(time.Millisecond), status,
			r.Header.Get("Mcp-Method"), r.Header.Get("Mcp-Name"), r.Header.Get("Mcp-Protocol-Version"), body)
		s.mu.Unlock()
	}
	return res, err
}

func (s *slowLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cmp.Or(s.log.String(), "(none)")
}

// resultDir is a directory the suite writes a scenario's checks.json into:
// server-<scenario>-<time>.
var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$`)

// runConformance runs every scenario the suite runs for a revision
// (--requirements: the scored ones, and those it reports unscored) and
// returns each scenario's checks.
func runConformance(t *testing.T, url, rev string) map[string][]check {
	t.Helper()
	dir := t.TempDir()
	out, errOut, err := runNode(t, nil, "conformance", "server", "--url", url, "--requirements", rev, "-o", dir)
	// It exits non-zero when a scenario fails: the checks say which.
	t.Logf("conformance server --requirements %s (%v):\n%s", rev, err, summary(out))
	entries, rerr := os.ReadDir(dir)
	if rerr != nil || len(entries) == 0 {
		t.Fatalf("the suite wrote no results (%v %v)\nstdout:\n%s\nstderr:\n%s", err, rerr, clip(out), clip(errOut))
	}
	results := map[string][]check{}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			t.Errorf("unexpected result %s", e.Name())
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if err != nil {
			t.Errorf("scenario %s: %v", m[1], err)
			continue
		}
		var checks []check
		if err := json.Unmarshal(b, &checks); err != nil {
			t.Errorf("scenario %s: checks.json: %v", m[1], err)
			continue
		}
		results[m[1]] = checks
	}
	return results
}

// summary is the suite's own summary at the end of its output.
func summary(out []byte) string {
	s := string(out)
	if i := strings.LastIndex(s, "=== SUMMARY ==="); i >= 0 {
		return s[i:]
	}
	return clip(out)
}

// judge compares a revision's results with what the file expects, both
// ways: a scenario the file does not list, or one it lists that did not
// run, fails too, so that the file stays true.
func judge(t *testing.T, want map[string]expectation, results map[string][]check) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(results)) {
		checks := results[name]
		w, ok := want[name]
		if !ok {
			t.Errorf("scenario %s: not in %s; it %s:%s", name, expectedFile, verdict(checks), failures(checks))
			continue
		}
		if w.Checks != nil {
			judgeChecks(t, name, w, checks)
			continue
		}
		failed := slices.ContainsFunc(checks, check.failed)
		switch {
		case w.Expect == "pass" && failed && w.OksoBug != "":
			t.Errorf("scenario %s fails: okso bug: %s%s", name, w.OksoBug, failures(checks))
		case w.Expect == "pass" && failed:
			t.Errorf("scenario %s fails:%s", name, failures(checks))
		case w.Expect == "not_applicable" && !failed:
			t.Errorf("scenario %s passes, though %s calls it not applicable (%s): if okso does it on purpose now, update the file", name, expectedFile, w.Reason)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if _, ok := results[name]; !ok {
			t.Errorf("scenario %s: in %s, but the suite did not run it", name, expectedFile)
		}
	}
}

// judgeChecks judges a scenario check by check.
func judgeChecks(t *testing.T, scenario string, w expectation, checks []check) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range checks {
		seen[c.ID] = true
		cw, ok := w.Checks[c.ID]
		if !ok {
			cw = expectation{Expect: "pass"}
		}
		switch {
		case cw.Expect == "pass" && c.failed() && cw.OksoBug != "":
			t.Errorf("scenario %s, check %s fails: okso bug: %s\n\t%s", scenario, c.ID, cw.OksoBug, c.ErrorMessage)
		case cw.Expect == "pass" && c.failed():
			t.Errorf("scenario %s, check %s fails: %s", scenario, c.ID, c.ErrorMessage)
		case cw.Expect == "not_applicable" && !c.failed():
			t.Errorf("scenario %s, check %s is %s, though %s calls it not applicable (%s): if okso does it on purpose now, update the file",
				scenario, c.ID, c.Status, expectedFile, cw.Reason)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(w.Checks)) {
		if !seen[id] {
			t.Errorf("scenario %s, check %s: in %s, but the suite did not report it", scenario, id, expectedFile)
		}
	}
}

func verdict(checks []check) string {
	if slices.ContainsFunc(checks, check.failed) {
		return "fails"
	}
	return "passes"
}

// failures lists a scenario's failed checks, one a line.
func failures(checks []check) string {
	var b strings.Builder
	for _, c := range checks {
		if c.failed() {
			fmt.Fprintf(&b, "\n\t%s: %s", c.ID, c.ErrorMessage)
		}
	}
	return b.String()
}
