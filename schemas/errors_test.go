package schemas_test

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/okso-io/okso/schemas"
)

var codes = map[string]string{
	schemas.CodeBadRequest:       "usage",
	schemas.CodeManifestInvalid:  "invalid_arguments",
	schemas.CodeToolNotFound:     "tool_not_found",
	schemas.CodeSafetyDenied:     "unauthorized",
	schemas.CodeNodeOffline:      "provider_failure",
	schemas.CodeDeadlineExceeded: "timeout",
	schemas.CodeRateLimited:      "provider_failure",
	schemas.CodeInternal:         "fatal",
}

func TestErrorEnvelope(t *testing.T) {
	names := map[string]string{
		"E_BAD_REQUEST": schemas.CodeBadRequest, "E_MANIFEST_INVALID": schemas.CodeManifestInvalid,
		"E_TOOL_NOT_FOUND": schemas.CodeToolNotFound, "E_SAFETY_DENIED": schemas.CodeSafetyDenied,
		"E_NODE_OFFLINE": schemas.CodeNodeOffline, "E_DEADLINE_EXCEEDED": schemas.CodeDeadlineExceeded,
		"E_RATE_LIMITED": schemas.CodeRateLimited, "E_INTERNAL": schemas.CodeInternal,
	}
	for lit, c := range names {
		if lit != c {
			t.Errorf("constant for %s is %q", lit, c)
		}
	}
	s, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	for code, cat := range codes {
		if got := schemas.Category(code); got != cat {
			t.Errorf("Category(%s) = %s, want %s", code, got, cat)
		}
		if !schemas.KnownCode(code) {
			t.Errorf("KnownCode(%s) = false", code)
		}
		e := schemas.NewError(code, "something happened")
		if e.Code != code || e.Category != cat || e.Message != "something happened" {
			t.Errorf("NewError(%s) = %+v", code, e)
		}
		if e.Error() != code+": something happened" {
			t.Errorf("Error() = %q", e.Error())
		}
		if err := s.ValidateJSON(schemas.ErrorEnvelope, e.JSON()); err != nil {
			t.Errorf("%s envelope fails the error schema: %v", code, err)
		}
	}
	for _, code := range []string{"", "E_TIMEOUT", "E_UNAUTHORIZED", "e_internal", "E_BAD_REQUEST ", "fatal"} {
		if schemas.KnownCode(code) {
			t.Errorf("KnownCode(%q) = true", code)
		}
		if got := schemas.Category(code); got != "fatal" {
			t.Errorf("Category(%q) = %s, want fatal", code, got)
		}
		e := schemas.NewError(code, "x")
		if e.Code != schemas.CodeInternal || e.Category != "fatal" {
			t.Errorf("NewError(%q) = %+v, want E_INTERNAL/fatal", code, e)
		}
	}
	got := string(schemas.NewError(schemas.CodeNodeOffline, "node is offline").JSON())
	want := `{"code":"E_NODE_OFFLINE","category":"provider_failure","message":"node is offline"}`
	if got != want {
		t.Errorf("JSON() = %s, want %s", got, want)
	}
}

// TestErrorCodesMatchSchema: the closed set of codes and categories in Go
// is the one the error envelope's schema states.
func TestErrorCodesMatchSchema(t *testing.T) {
	set, err := schemas.Load()
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := set.Raw(schemas.ErrorEnvelope)
	if !ok {
		t.Fatal("no error envelope schema")
	}
	var doc struct {
		Properties struct {
			Code     struct{ Enum []string } `json:"code"`
			Category struct{ Enum []string } `json:"category"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	wantCodes := slices.Sorted(maps.Keys(codes))
	if got := slices.Sorted(slices.Values(doc.Properties.Code.Enum)); !slices.Equal(got, wantCodes) {
		t.Errorf("schema codes %v, Go codes %v", got, wantCodes)
	}
	wantCats := slices.Compact(slices.Sorted(maps.Values(codes)))
	if got := slices.Sorted(slices.Values(doc.Properties.Category.Enum)); !slices.Equal(got, wantCats) {
		t.Errorf("schema categories %v, Go categories %v", got, wantCats)
	}
}
