package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
)

// docs/security.md: every call but a few needs a bearer token, and the CLI
// takes it from --acl-token or DLOCK_ACL_TOKEN; snapshots need `admin`, so
// snapshot save must send it (it once sent none and refused --acl-token).
func TestSnapshotSaveSendsACLToken(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Get("Authorization")
		if got == "" {
			http.Error(w, `{"error":{"code":"unauthenticated"}}`, http.StatusUnauthorized)
			return
		}
		w.Write([]byte("snap"))
	}))
	defer srv.Close()
	t.Setenv("DLOCK_TOKEN", "s3cret")
	file := filepath.Join(t.TempDir(), "b.snap")
	_, err := execute("snapshot", "save", file, "--endpoint", srv.URL)
	if got != "Bearer s3cret" {
		t.Errorf("with DLOCK_TOKEN set: Authorization %q, err %v; want Bearer s3cret", got, err)
	}
	if _, err := execute("snapshot", "save", file, "--endpoint", srv.URL, "--acl-token", "s3cret", "--force"); err != nil {
		t.Errorf("--acl-token: %v", err)
	}
}
