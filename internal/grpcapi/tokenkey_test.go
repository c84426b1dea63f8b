package grpcapi

import (
	"context"
	"crypto/ed25519"
	"testing"

	dlockv1 "github.com/dlock/dlock/api/dlock/v1"
	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/service"
)

type keyFake struct {
	Service
	doc     *fence.KeySetDocument
	rotated []service.RotateTokenKeyRequest
}

func (f *keyFake) TokenKeys(context.Context) (*fence.KeySetDocument, error) { return f.doc, nil }

func (f *keyFake) RotateTokenKey(_ context.Context, req service.RotateTokenKeyRequest) (*fence.KeySetDocument, error) {
	f.rotated = append(f.rotated, req)
	return f.doc, nil
}

// gRPC carries the same key set as HTTP: max_token present exactly on the
// retired keys (bound 0 included), and revoke_retired reaches the service.
func TestTokenKeysParity(t *testing.T) {
	cur := ed25519.PublicKey(make([]byte, 32))
	old1 := ed25519.PublicKey(append(make([]byte, 31), 1))
	old2 := ed25519.PublicKey(append(make([]byte, 31), 2))
	f := &keyFake{doc: &fence.KeySetDocument{Keys: []fence.KeyInfo{
		fence.NewKeyInfo(cur, true), fence.NewRetiredKeyInfo(old1, 41), fence.NewRetiredKeyInfo(old2, 0)}}}
	c := dlockv1.NewClusterServiceClient(serve(t, f))
	check := func(keys []*dlockv1.TokenKey) {
		t.Helper()
		if len(keys) != 3 {
			t.Fatalf("%d keys", len(keys))
		}
		for i, k := range keys {
			want := f.doc.Keys[i]
			if k.Id != want.ID || k.Algorithm != want.Algorithm || k.PublicKey != want.PublicKey || k.Current != want.Current {
				t.Errorf("key %d: %v, want %+v", i, k, want)
			}
			if (k.MaxToken == nil) != (want.MaxToken == nil) || (k.MaxToken != nil && *k.MaxToken != *want.MaxToken) {
				t.Errorf("key %d: max_token %v, want %v", i, k.MaxToken, want.MaxToken)
			}
		}
		// What a gRPC resource does with the answer.
		doc := fence.KeySetDocument{}
		for _, k := range keys {
			doc.Keys = append(doc.Keys, fence.KeyInfo{ID: k.Id, Algorithm: k.Algorithm, PublicKey: k.PublicKey, Current: k.Current, MaxToken: k.MaxToken})
		}
		ks, err := fence.NewKeySetFromDocument(doc)
		if err != nil {
			t.Fatal(err)
		}
		if max, bounded := ks.MaxToken(fence.KeyIDOf(old1)); !bounded || max != 41 {
			t.Errorf("bound of the retired key: %d, %v", max, bounded)
		}
	}
	got, err := c.GetTokenKeys(context.Background(), &dlockv1.GetTokenKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	check(got.Keys)
	for _, revoke := range []bool{false, true} {
		r, err := c.RotateTokenKey(context.Background(), &dlockv1.RotateTokenKeyRequest{RevokeRetired: revoke})
		if err != nil {
			t.Fatal(err)
		}
		check(r.Keys)
	}
	if len(f.rotated) != 2 || f.rotated[0].RevokeRetired || !f.rotated[1].RevokeRetired {
		t.Fatalf("service saw %+v", f.rotated)
	}
}
