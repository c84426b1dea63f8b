package datastore

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock/dlock/fence"
)

const (
	lockName = "billing/job"
	leaseA   = "0123456789abcdef0123456789abcdef"
	leaseB   = "fedcba9876543210fedcba9876543210"
)

type env struct {
	t    *testing.T
	dir  string
	priv ed25519.PrivateKey
	keys *fence.KeySet
	srv  *Server
	http *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, dir: t.TempDir(), priv: priv, keys: fence.NewKeySet(priv.Public().(ed25519.PublicKey))}
	e.start(Config{KeySet: e.keys})
	t.Cleanup(e.stop)
	return e
}

func (e *env) start(cfg Config) {
	e.t.Helper()
	cfg.DataDir = e.dir
	srv, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.srv, e.http = srv, httptest.NewServer(srv.Handler())
}

func (e *env) stop() {
	e.http.Close()
	if err := e.srv.Close(); err != nil {
		e.t.Error(err)
	}
}

// write is a well-formed write by a holder of (token, lease), signed by the
// env's key; fields can be overridden.
func (e *env) write(client, lease string, token uint64, data string) map[string]any {
	return map[string]any{
		"client_id": client, "lock": lockName, "fencing_token": token, "lease_ref": fence.LeaseRef(lease),
		"token_proof": fence.SignProof(e.priv, lockName, token, client, fence.LeaseRef(lease)), "data": data,
	}
}

func (e *env) post(body any) (int, map[string]any) {
	e.t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	resp, err := http.Post(e.http.URL+"/write", "application/json", bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		e.t.Fatalf("answer is not JSON: %v", err)
	}
	return resp.StatusCode, out
}

func (e *env) records(query string) []Record {
	e.t.Helper()
	resp, err := http.Get(e.http.URL + "/data" + query)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out dataReply
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		e.t.Fatalf("GET /data%s: %s", query, resp.Status)
	}
	return out.Records
}

// expect checks status and, for errors, the code.
func expect(t *testing.T, status int, body map[string]any, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d; body %v", status, wantStatus, body)
	}
	if wantCode == "" {
		return
	}
	e, _ := body["error"].(map[string]any)
	if e["code"] != wantCode || e["message"] == "" {
		t.Fatalf("error %v, want code %q with a message", body["error"], wantCode)
	}
}

func tokens(recs []Record) []uint64 {
	var out []uint64
	for _, r := range recs {
		out = append(out, r.FencingToken)
	}
	return out
}

func TestAcceptedWrite(t *testing.T) {
	e := newEnv(t)
	status, body := e.post(e.write("w1", leaseA, 5, "hello"))
	expect(t, status, body, 200, "")
	if body["accepted"] != true || body["highest_token"] != float64(5) {
		t.Fatalf("answer %v, want accepted with highest_token 5", body)
	}
	recs := e.records("")
	if len(recs) != 1 || recs[0].Data != "hello" || recs[0].ClientID != "w1" || recs[0].Lock != lockName || recs[0].At.IsZero() {
		t.Fatalf("records %+v", recs)
	}
}

func TestStaleWriteRefused(t *testing.T) {
	e := newEnv(t)
	status, body := e.post(e.write("w2", leaseB, 6, "new holder"))
	expect(t, status, body, 200, "")
	// The paused first holder wakes up with its old, genuinely signed grant.
	status, body = e.post(e.write("w1", leaseA, 5, "from the past"))
	expect(t, status, body, http.StatusConflict, "stale_token")
	if body["highest_token"] != float64(6) || body["accepted"] != false {
		t.Errorf("answer %v, want accepted false, highest_token 6", body)
	}
	if got := tokens(e.records("")); len(got) != 1 || got[0] != 6 {
		t.Errorf("stored tokens %v, want only [6]", got)
	}
}

func TestProofChecks(t *testing.T) {
	_, stranger, _ := ed25519.GenerateKey(nil)
	tests := []struct {
		name string
		mod  func(e *env, w map[string]any)
		code string
	}{
		{"forged with another key", func(e *env, w map[string]any) {
			w["token_proof"] = fence.SignProof(stranger, lockName, 9, "w1", fence.LeaseRef(leaseA))
		}, "bad_proof"},
		{"valid proof replayed with a higher token", func(e *env, w map[string]any) {
			w["token_proof"] = fence.SignProof(e.priv, lockName, 5, "w1", fence.LeaseRef(leaseA))
		}, "bad_proof"},
		{"proof of another lock", func(e *env, w map[string]any) {
			w["token_proof"] = fence.SignProof(e.priv, "other", 9, "w1", fence.LeaseRef(leaseA))
		}, "bad_proof"},
		{"proof of another client", func(e *env, w map[string]any) {
			w["token_proof"] = fence.SignProof(e.priv, lockName, 9, "w2", fence.LeaseRef(leaseA))
		}, "bad_proof"},
		{"garbage proof", func(e *env, w map[string]any) { w["token_proof"] = "not-a-proof" }, "bad_proof"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			w := e.write("w1", leaseA, 9, "x")
			tt.mod(e, w)
			status, body := e.post(w)
			expect(t, status, body, http.StatusForbidden, tt.code)
			if recs := e.records(""); len(recs) != 0 {
				t.Errorf("stored %+v after a refused write", recs)
			}
			// A refused proof must not have moved the token: the real holder
			// of 9 can still write.
			status, body = e.post(e.write("w1", leaseA, 9, "real"))
			expect(t, status, body, 200, "")
		})
	}
}

func TestSameGrantRewrite(t *testing.T) {
	e := newEnv(t)
	for _, data := range []string{"first", "second"} {
		status, body := e.post(e.write("w1", leaseA, 7, data))
		expect(t, status, body, 200, "")
	}
	// Same token, another holder: refused even with a valid signature.
	status, body := e.post(e.write("w2", leaseB, 7, "intruder"))
	expect(t, status, body, http.StatusConflict, "stale_token")
	// The lease reference is case-insensitive hex; it is the same grant.
	w := e.write("w1", leaseA, 7, "third")
	w["lease_ref"] = strings.ToUpper(fence.LeaseRef(leaseA))
	status, body = e.post(w)
	expect(t, status, body, 200, "")
	if got := e.records(""); len(got) != 3 || got[2].Data != "third" {
		t.Errorf("records %+v, want first, second, third", got)
	}
}

func TestRestartRemembersTokens(t *testing.T) {
	e := newEnv(t)
	status, body := e.post(e.write("w2", leaseB, 10, "before restart"))
	expect(t, status, body, 200, "")
	e.stop()
	e.start(Config{KeySet: e.keys})
	status, body = e.post(e.write("w1", leaseA, 9, "stale"))
	expect(t, status, body, http.StatusConflict, "stale_token")
	status, body = e.post(e.write("w2", leaseB, 10, "same grant, after restart"))
	expect(t, status, body, 200, "")
	if got := tokens(e.records("")); len(got) != 2 {
		t.Errorf("records %v, want the two writes of token 10", got)
	}
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t)
	good := func(mod func(map[string]any)) string {
		w := e.write("w1", leaseA, 3, "d")
		mod(w)
		b, _ := json.Marshal(w)
		return string(b)
	}
	tests := []struct{ name, body, inMessage string }{
		{"not JSON", `{"client_id":`, "not a valid write"},
		{"array", `[1]`, "not a valid write"},
		{"unknown field", good(func(w map[string]any) { w["colour"] = "red" }), "unknown field"},
		{"two objects", good(func(map[string]any) {}) + `{}`, "after the JSON object"},
		{"negative token", good(func(w map[string]any) { w["fencing_token"] = -1 }), "not a valid write"},
		{"token as string", good(func(w map[string]any) { w["fencing_token"] = "3" }), "not a valid write"},
		{"missing token", good(func(w map[string]any) { delete(w, "fencing_token") }), "fencing_token is required"},
		{"zero token", good(func(w map[string]any) { w["fencing_token"] = 0 }), "fencing_token is required"},
		{"missing client", good(func(w map[string]any) { delete(w, "client_id") }), "client_id"},
		{"client with space", good(func(w map[string]any) { w["client_id"] = "a b" }), "client_id"},
		{"client too long", good(func(w map[string]any) { w["client_id"] = strings.Repeat("c", 129) }), "client_id"},
		{"missing lock", good(func(w map[string]any) { delete(w, "lock") }), "lock"},
		{"bad lock", good(func(w map[string]any) { w["lock"] = "a//b" }), "lock"},
		{"lock too long", good(func(w map[string]any) { w["lock"] = strings.Repeat("l", 257) }), "lock"},
		{"missing lease", good(func(w map[string]any) { delete(w, "lease_ref") }), "lease_ref"},
		{"bad lease", good(func(w map[string]any) { w["lease_ref"] = "xyz" }), "lease_ref"},
		{"raw lease id", good(func(w map[string]any) { w["lease_id"] = leaseA }), "lease_id"},
		{"missing proof", good(func(w map[string]any) { delete(w, "token_proof") }), "token_proof is required"},
		{"missing data", good(func(w map[string]any) { delete(w, "data") }), "data is required"},
		{"data too long", good(func(w map[string]any) { w["data"] = strings.Repeat("d", MaxDataBytes+1) }), "the limit"},
		{"oversized body", good(func(w map[string]any) { w["data"] = strings.Repeat("d", MaxBodyBytes) }), "over"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := e.post(tt.body)
			expect(t, status, body, http.StatusBadRequest, "invalid_argument")
			if msg := body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, tt.inMessage) {
				t.Errorf("message %q does not mention %q", msg, tt.inMessage)
			}
		})
	}
	if recs := e.records(""); len(recs) != 0 {
		t.Errorf("bad requests stored %+v", recs)
	}
}

func TestLockNameIsCanonical(t *testing.T) {
	e := newEnv(t)
	status, body := e.post(e.write("w1", leaseA, 4, "x"))
	expect(t, status, body, 200, "")
	// "/billing/job" is the same lock: a stale writer cannot dodge the
	// check by spelling the name differently.
	w := e.write("w0", leaseB, 3, "stale")
	w["lock"] = "/" + lockName
	status, body = e.post(w)
	expect(t, status, body, http.StatusConflict, "stale_token")
}

func TestElectionLeaderWrites(t *testing.T) {
	e := newEnv(t)
	w := e.write("leader-1", leaseA, 12, "as leader")
	w["lock"] = "@e/" + lockName
	w["token_proof"] = fence.SignProof(e.priv, "@e/"+lockName, 12, "leader-1", fence.LeaseRef(leaseA))
	status, body := e.post(w)
	expect(t, status, body, 200, "")
	// The election and the lock of the same name are different keys.
	status, body = e.post(e.write("w1", leaseB, 3, "lock"))
	expect(t, status, body, 200, "")
	w["lock"] = "@e/a//b"
	status, body = e.post(w)
	expect(t, status, body, http.StatusBadRequest, "invalid_argument")
}

func TestDataQuery(t *testing.T) {
	e := newEnv(t)
	other := func(token uint64) map[string]any {
		w := e.write("w9", leaseB, token, "o")
		w["lock"] = "other"
		w["token_proof"] = fence.SignProof(e.priv, "other", token, "w9", fence.LeaseRef(leaseB))
		return w
	}
	for _, w := range []map[string]any{e.write("w1", leaseA, 1, "a"), other(2), e.write("w1", leaseA, 3, "b"), other(4)} {
		status, body := e.post(w)
		expect(t, status, body, 200, "")
	}
	if got := fmt.Sprint(tokens(e.records("?lock=" + lockName))); got != "[1 3]" {
		t.Errorf("?lock= gave tokens %s, want [1 3]", got)
	}
	if got := fmt.Sprint(tokens(e.records("?limit=2"))); got != "[3 4]" {
		t.Errorf("?limit=2 gave tokens %s, want the newest two in order, [3 4]", got)
	}
	for _, q := range []string{"?lok=x", "?limit=0", "?limit=x", "?lock=a//b", "?lock=a&lock=b"} {
		resp, err := http.Get(e.http.URL + "/data" + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /data%s: %s, want 400", q, resp.Status)
		}
	}
}

func TestInsecureNoProof(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Config{DataDir: dir}); err == nil {
		t.Fatal("New without a KeySet and without InsecureNoProof succeeded")
	}
	e := &env{t: t, dir: dir}
	e.start(Config{InsecureNoProof: true})
	defer e.stop()
	w := map[string]any{"client_id": "mallory", "lock": lockName, "fencing_token": uint64(1) << 62, "lease_ref": fence.LeaseRef(leaseA), "data": "owned"}
	status, body := e.post(w)
	expect(t, status, body, 200, "")
	if body["insecure_no_proof"] != true {
		t.Errorf("answer %v does not say the proof was not checked", body)
	}
	// This is the hole proofs close: the honest next holder is now locked out.
	w = map[string]any{"client_id": "honest", "lock": lockName, "fencing_token": 7, "lease_ref": fence.LeaseRef(leaseB), "data": "x"}
	status, body = e.post(w)
	expect(t, status, body, http.StatusConflict, "stale_token")
}

func TestKeyRotation(t *testing.T) {
	e := newEnv(t)
	_, newPriv, _ := ed25519.GenerateKey(nil)
	w := e.write("w1", leaseA, 2, "x")
	w["token_proof"] = fence.SignProof(newPriv, lockName, 2, "w1", fence.LeaseRef(leaseA))
	status, body := e.post(w)
	expect(t, status, body, http.StatusForbidden, "bad_proof")
	e.srv.SetKeySet(fence.NewKeySet(newPriv.Public().(ed25519.PublicKey), e.priv.Public().(ed25519.PublicKey)))
	e.srv.SetKeySet(nil) // ignored
	status, body = e.post(w)
	expect(t, status, body, 200, "")
	status, body = e.post(e.write("w1", leaseA, 3, "old key, still trusted"))
	expect(t, status, body, 200, "")
}

func TestRoutes(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/write", 405}, {"POST", "/data", 405}, {"GET", "/nope", 404}, {"GET", "/healthz", 200},
	} {
		req, _ := http.NewRequest(c.method, e.http.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %s (%s), want %d JSON", c.method, c.path, resp.Status, resp.Header.Get("Content-Type"), c.want)
		}
	}
}

func TestFormPostRefused(t *testing.T) {
	e := newEnv(t)
	b, _ := json.Marshal(e.write("w1", leaseA, 1, "x"))
	resp, err := http.Post(e.http.URL+"/write", "text/plain", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("text/plain post: %s, want 400", resp.Status)
	}
}

// TestConcurrentWritersStayOrdered races writers with shuffled tokens: the
// stored log must never show a token after a higher one.
func TestConcurrentWritersStayOrdered(t *testing.T) {
	e := newEnv(t)
	// Widen the window between check and append, where a reordering would
	// happen if the two were not done under one lock.
	e.srv.afterCheck = func() { time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond) }
	const writers, perWriter = 8, 15
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			client := fmt.Sprintf("w%d", w)
			for _, i := range rand.Perm(perWriter) {
				token := uint64(i*writers + w + 1)
				status, body := e.post(e.write(client, leaseA, token, "x"))
				if status != 200 && status != http.StatusConflict {
					t.Errorf("token %d: %d %v", token, status, body)
				}
			}
		})
	}
	wg.Wait()
	got := tokens(e.records(""))
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("stored tokens out of order at %d: %v", i, got)
		}
	}
	if len(got) == 0 || got[len(got)-1] != writers*perWriter {
		t.Errorf("stored tokens %v, want the last to be %d", got, writers*perWriter)
	}
}
