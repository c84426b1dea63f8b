package httpapi

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/dlock/dlock/api/openapi"
)

// The document is served as it is embedded, to GET and HEAD alike, and the
// route is as strict as the others about methods and query parameters.
func TestOpenAPIDocument(t *testing.T) {
	h, _ := newHandler(&fakeService{}, Options{})
	want, err := openapi.JSON()
	if err != nil {
		t.Fatal(err)
	}
	rec := do(h, request{method: "GET", target: "/api/v1/openapi.json"})
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want) || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET: %d %q, %d bytes; want 200 and the embedded document", rec.Code, rec.Header().Get("Content-Type"), rec.Body.Len())
	}
	if rec := do(h, request{method: "HEAD", target: "/api/v1/openapi.json"}); rec.Code != http.StatusOK || rec.Body.Len() != 0 {
		t.Fatalf("HEAD: %d with %d bytes", rec.Code, rec.Body.Len())
	}
	if rec := do(h, request{method: "POST", target: "/api/v1/openapi.json", body: "{}"}); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	if rec := do(h, request{method: "GET", target: "/api/v1/openapi.json?x=1"}); rec.Code != http.StatusBadRequest {
		t.Fatalf("unknown query parameter: %d", rec.Code)
	}
}
