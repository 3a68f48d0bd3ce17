package bearer_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/okso-io/okso/internal/bearer"
)

// TestTransport: each request reaches the server with the token, and the
// caller's request is left without it.
func TestTransport(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	defer srv.Close()
	c := &http.Client{Transport: bearer.Transport{Token: "t0k"}}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if h := <-got; h != "Bearer t0k" {
		t.Errorf("the server saw Authorization %q", h)
	}
	if h := req.Header.Get("Authorization"); h != "" {
		t.Errorf("the caller's request was changed: Authorization %q", h)
	}
}
