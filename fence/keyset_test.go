package fence

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestKeySetDocumentRoundTrip(t *testing.T) {
	pub1, _ := testKey(1)
	pub2, priv2 := testKey(2)
	body, err := json.Marshal(NewKeySetDocument(pub2, pub1))
	if err != nil {
		t.Fatal(err)
	}
	ks, err := ParseKeySet(body)
	if err != nil {
		t.Fatalf("ParseKeySet(%s): %v", body, err)
	}
	want := []KeyID{KeyIDOf(pub1), KeyIDOf(pub2)}
	slices.SortFunc(want, func(a, b KeyID) int { return strings.Compare(a.String(), b.String()) })
	if got := ks.IDs(); !slices.Equal(got, want) {
		t.Errorf("IDs = %v, want %v", got, want)
	}
	if err := ks.Verify("l", 1, "c", "x", SignProof(priv2, "l", 1, "c", "x")); err != nil {
		t.Error(err)
	}
	var doc KeySetDocument
	_ = json.Unmarshal(body, &doc)
	if !doc.Keys[0].Current || doc.Keys[1].Current || doc.Keys[0].Algorithm != "ed25519" {
		t.Errorf("document %s: want the first key current, algorithm ed25519", body)
	}
}

func TestParseKeySetRejects(t *testing.T) {
	pub, _ := testKey(1)
	other, _ := testKey(2)
	good := KeyInfo{ID: KeyIDOf(pub).String(), Algorithm: "ed25519", PublicKey: base64.StdEncoding.EncodeToString(pub), Current: true}
	doc := func(mod func(*KeyInfo)) string {
		k := good
		mod(&k)
		b, _ := json.Marshal(KeySetDocument{Keys: []KeyInfo{k}})
		return string(b)
	}
	tests := []struct{ name, body, wantInErr string }{
		{"not JSON", `{"keys":[`, "not a JSON"},
		{"wrong shape", `{"keys":{"id":"x"}}`, "not a JSON"},
		{"no keys", `{"keys":[]}`, "no keys"},
		{"empty object", `{}`, "no keys"},
		{"algorithm", doc(func(k *KeyInfo) { k.Algorithm = "rsa" }), "algorithm"},
		{"algorithm case", doc(func(k *KeyInfo) { k.Algorithm = "Ed25519" }), "algorithm"},
		{"short key", doc(func(k *KeyInfo) { k.PublicKey = base64.StdEncoding.EncodeToString(pub[:31]) }), "31 bytes"},
		{"long key", doc(func(k *KeyInfo) { k.PublicKey = base64.StdEncoding.EncodeToString(append(slices.Clone(pub), 0)) }), "33 bytes"},
		{"key not base64", doc(func(k *KeyInfo) { k.PublicKey = "%%%" }), "base64"},
		{"id mismatch", doc(func(k *KeyInfo) { k.ID = KeyIDOf(other).String() }), "does not match"},
		{"id not hex", doc(func(k *KeyInfo) { k.ID = "zz" }), "hex"},
		{"id too short", doc(func(k *KeyInfo) { k.ID = k.ID[:14] }), "hex"},
		{"duplicate", `{"keys":[` + mustJSON(good) + "," + mustJSON(good) + `]}`, "twice"},
		{"current key with a bound", doc(func(k *KeyInfo) { k.MaxToken = new(uint64) }), "current but has max_token"},
		{"negative bound", strings.Replace(doc(func(k *KeyInfo) { k.Current = false; k.MaxToken = new(uint64) }), `"max_token":0`, `"max_token":-1`, 1), "not a JSON"},
		{"bound not a number", strings.Replace(doc(func(k *KeyInfo) { k.Current = false; k.MaxToken = new(uint64) }), `"max_token":0`, `"max_token":"7"`, 1), "not a JSON"},
		{"bound over 64 bits", strings.Replace(doc(func(k *KeyInfo) { k.Current = false; k.MaxToken = new(uint64) }), `"max_token":0`, `"max_token":18446744073709551616`, 1), "not a JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks, err := ParseKeySet([]byte(tt.body))
			if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
				t.Fatalf("ParseKeySet(%s) = %v, %v; want an error containing %q", tt.body, ks, err, tt.wantInErr)
			}
		})
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestParseKeySetIgnoresUnknownFields(t *testing.T) {
	pub, _ := testKey(1)
	body := `{"keys":[{"id":"` + KeyIDOf(pub).String() + `","algorithm":"ed25519","public_key":"` +
		base64.StdEncoding.EncodeToString(pub) + `","current":true,"created_at":"2026-01-01T00:00:00Z"}],"revision":3}`
	if _, err := ParseKeySet([]byte(body)); err != nil {
		t.Fatal(err)
	}
}

func TestNewKeySetSkipsBadKeys(t *testing.T) {
	pub, _ := testKey(1)
	ks := NewKeySet(pub, ed25519.PublicKey{1, 2, 3}, nil)
	if ids := ks.IDs(); len(ids) != 1 || ids[0] != KeyIDOf(pub) {
		t.Errorf("IDs = %v, want only %s", ids, KeyIDOf(pub))
	}
}

func TestFetchKeySet(t *testing.T) {
	pub, priv := testKey(1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+TokenKeyPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(NewKeySetDocument(pub))
	})
	good := httptest.NewServer(mux)
	defer good.Close()

	missing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		w.Write([]byte(`{"error":{"code":"not_found","message":"no such route"}}`))
	}))
	defer missing.Close()
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>hello</html>"))
	}))
	defer garbage.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(strings.Repeat(" ", maxKeySetBytes+10)))
	}))
	defer huge.Close()

	tests := []struct{ name, url, wantInErr string }{
		{"ok", good.URL, ""},
		{"trailing slash", good.URL + "/", ""},
		{"404 with dlock error", missing.URL, "no such route"},
		{"not a document", garbage.URL, "not a JSON"},
		{"too large", huge.URL, "over"},
		{"nobody listening", "http://127.0.0.1:1", "is a dlock node serving"},
		{"bad URL", "://nope", "bad cluster URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks, err := FetchKeySet(context.Background(), nil, tt.url)
			if tt.wantInErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
					t.Fatalf("FetchKeySet = %v, want an error containing %q", err, tt.wantInErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := ks.Verify("l", 3, "c", "x", SignProof(priv, "l", 3, "c", "x")); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestFetchKeySetHonoursContext(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := FetchKeySet(ctx, srv.Client(), srv.URL); err == nil {
		t.Fatal("FetchKeySet with a cancelled context succeeded")
	}
}

// The cluster's document lists each retired key with max_token and the
// current key without; a document from a cluster older than the field has
// no max_token at all, and its retired keys verify any token as before.
func TestParseKeySetMaxToken(t *testing.T) {
	pub1, priv1 := testKey(1)
	pub2, priv2 := testKey(2)
	pub3, priv3 := testKey(3)
	id := func(p ed25519.PublicKey) string { return KeyIDOf(p).String() }
	b64 := func(p ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(p) }
	entry := func(p ed25519.PublicKey, current bool, extra string) string {
		return fmt.Sprintf(`{"id":%q,"algorithm":"ed25519","public_key":%q,"current":%v%s}`, id(p), b64(p), current, extra)
	}
	tests := []struct {
		name string
		body string
		// token by key: the highest token each key verifies, or 0 for any.
		bounds map[*ed25519.PrivateKey]uint64
	}{
		{"with bounds", `{"keys":[` + entry(pub3, true, "") + "," + entry(pub2, false, `,"max_token":70`) + "," + entry(pub1, false, `,"max_token":12`) + `]}`,
			map[*ed25519.PrivateKey]uint64{&priv3: 0, &priv2: 70, &priv1: 12}},
		{"bound zero", `{"keys":[` + entry(pub3, true, "") + "," + entry(pub1, false, `,"max_token":0`) + `]}`,
			map[*ed25519.PrivateKey]uint64{&priv3: 0, &priv1: 0}},
		{"older cluster: no bounds", `{"keys":[` + entry(pub3, true, "") + "," + entry(pub1, false, "") + `]}`,
			map[*ed25519.PrivateKey]uint64{&priv3: 0, &priv1: 0}},
		{"current key with null bound", `{"keys":[` + entry(pub3, true, `,"max_token":null`) + `]}`,
			map[*ed25519.PrivateKey]uint64{&priv3: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ks, err := ParseKeySet([]byte(tt.body))
			if err != nil {
				t.Fatalf("ParseKeySet(%s): %v", tt.body, err)
			}
			for priv, bound := range tt.bounds {
				pub := priv.Public().(ed25519.PublicKey)
				max, bounded := ks.MaxToken(KeyIDOf(pub))
				wantBounded := strings.Contains(tt.body, id(pub)+`","algorithm":"ed25519","public_key":"`+b64(pub)+`","current":false,"max_token":`)
				if bounded != wantBounded || max != bound {
					t.Fatalf("key %s: MaxToken = %d, %v; want %d, %v", id(pub), max, bounded, bound, wantBounded)
				}
				at := bound
				if !bounded {
					at = 1 << 62
				}
				if err := ks.Verify("l", at, "c", "r", SignProof(*priv, "l", at, "c", "r")); at > 0 && err != nil {
					t.Errorf("key %s, token %d: %v", id(pub), at, err)
				}
				err := ks.Verify("l", at+1, "c", "r", SignProof(*priv, "l", at+1, "c", "r"))
				if bounded && !errors.Is(err, ErrTokenAboveKeyBound) {
					t.Errorf("key %s, token %d over the bound %d: %v", id(pub), at+1, bound, err)
				}
				if !bounded && err != nil {
					t.Errorf("unbounded key %s, token %d: %v", id(pub), at+1, err)
				}
			}
		})
	}
}

func TestKeyInfoJSON(t *testing.T) {
	pub1, _ := testKey(1)
	pub2, _ := testKey(2)
	body, err := json.Marshal(KeySetDocument{Keys: []KeyInfo{NewKeyInfo(pub2, true), NewRetiredKeyInfo(pub1, 0), NewRetiredKeyInfo(pub1, 1<<63)}})
	if err != nil {
		t.Fatal(err)
	}
	var raw struct{ Keys []map[string]any }
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw.Keys[0]["max_token"]; ok {
		t.Errorf("the current key has max_token: %s", body)
	}
	if v, ok := raw.Keys[1]["max_token"]; !ok || v != float64(0) {
		t.Errorf("a retired key with bound 0 lost it: %s", body)
	}
	if !strings.Contains(string(body), `"max_token":9223372036854775808`) {
		t.Errorf("a large bound is not written exactly: %s", body)
	}
	if _, err := ParseKeySet(body); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("ParseKeySet: %v", err) // the same key listed twice (only to test the encoding)
	}
}

func TestNewKeySetIsUnbounded(t *testing.T) {
	pub, priv := testKey(1)
	ks := NewKeySet(pub)
	if _, bounded := ks.MaxToken(KeyIDOf(pub)); bounded {
		t.Fatal("NewKeySet bounded a key")
	}
	if err := ks.Verify("l", 1<<62, "c", "r", SignProof(priv, "l", 1<<62, "c", "r")); err != nil {
		t.Fatal(err)
	}
	var nilSet *KeySet
	if _, bounded := nilSet.MaxToken(KeyIDOf(pub)); bounded {
		t.Fatal("a nil set bounds a key")
	}
}

func TestFetchKeySetKeepsBounds(t *testing.T) {
	pub1, priv1 := testKey(1)
	pub2, _ := testKey(2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(KeySetDocument{Keys: []KeyInfo{NewKeyInfo(pub2, true), NewRetiredKeyInfo(pub1, 5)}})
	}))
	defer srv.Close()
	ks, err := FetchKeySet(context.Background(), srv.Client(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Verify("l", 5, "c", "r", SignProof(priv1, "l", 5, "c", "r")); err != nil {
		t.Fatal(err)
	}
	if err := ks.Verify("l", 6, "c", "r", SignProof(priv1, "l", 6, "c", "r")); !errors.Is(err, ErrTokenAboveKeyBound) {
		t.Fatalf("over the fetched bound: %v", err)
	}
}
