package httpapi

import (
	"crypto/ed25519"
	"reflect"
	"testing"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/service"
)

// POST /cluster/token-key/rotate takes an optional body, decoded as
// strictly as every other body: {"revoke_retired":true} revokes.
func TestRotateTokenKeyBody(t *testing.T) {
	const rotate = "/api/v1/cluster/token-key/rotate"
	jsonCT := map[string]string{"Content-Type": "application/json"}
	tests := []struct {
		name     string
		req      request
		want     *service.RotateTokenKeyRequest // nil: refused with wantCode
		wantCode apierror.Code
	}{
		{"no body", request{method: "POST", target: rotate}, &service.RotateTokenKeyRequest{}, ""},
		{"blank body", request{method: "POST", target: rotate, body: " \n"}, &service.RotateTokenKeyRequest{}, ""},
		{"empty object", request{method: "POST", target: rotate, header: jsonCT, body: `{}`}, &service.RotateTokenKeyRequest{}, ""},
		{"revoke", request{method: "POST", target: rotate, header: jsonCT, body: `{"revoke_retired":true}`}, &service.RotateTokenKeyRequest{RevokeRetired: true}, ""},
		{"revoke without Content-Type", request{method: "POST", target: rotate, header: map[string]string{"Content-Type": ""}, body: `{"revoke_retired":true}`}, nil, apierror.UnsupportedMediaType},
		{"explicitly keep", request{method: "POST", target: rotate, body: `{"revoke_retired":false}`}, &service.RotateTokenKeyRequest{}, ""},
		{"unknown field", request{method: "POST", target: rotate, body: `{"revoke":true}`}, nil, apierror.InvalidArgument},
		{"other case", request{method: "POST", target: rotate, body: `{"Revoke_Retired":true}`}, nil, apierror.InvalidArgument},
		{"repeated field", request{method: "POST", target: rotate, body: `{"revoke_retired":false,"revoke_retired":true}`}, nil, apierror.InvalidArgument},
		{"not a bool", request{method: "POST", target: rotate, body: `{"revoke_retired":"yes"}`}, nil, apierror.InvalidArgument},
		{"not an object", request{method: "POST", target: rotate, body: `true`}, nil, apierror.InvalidArgument},
		{"two objects", request{method: "POST", target: rotate, body: `{}{}`}, nil, apierror.InvalidArgument},
		{"not JSON", request{method: "POST", target: rotate, header: map[string]string{"Content-Type": "text/plain"}, body: `{"revoke_retired":true}`}, nil, apierror.UnsupportedMediaType},
		{"query", request{method: "POST", target: rotate + "?revoke_retired=true"}, nil, apierror.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeService{}
			h, _ := newHandler(f, Options{})
			rec := do(h, tt.req)
			calls := f.recorded()
			if tt.want == nil {
				checkError(t, rec, apierror.HTTPStatus(tt.wantCode), tt.wantCode)
				if len(calls) != 0 {
					t.Fatalf("service called: %+v", calls)
				}
				return
			}
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if len(calls) != 1 || calls[0].method != "RotateTokenKey" || !reflect.DeepEqual(calls[0].req, *tt.want) {
				t.Fatalf("service calls %+v, want RotateTokenKey(%+v)", calls, *tt.want)
			}
		})
	}
	f := &fakeService{}
	h, _ := newHandler(f, Options{})
	rec := do(h, request{method: "GET", target: rotate})
	checkError(t, rec, 405, apierror.MethodNotAllowed)
	if a := rec.Header().Get("Allow"); a != "POST" {
		t.Errorf("Allow %q", a)
	}
}

// The key-set document passes through as the service made it: max_token on
// the retired keys only.
func TestTokenKeyDocumentCarriesBounds(t *testing.T) {
	cur := ed25519.PublicKey(make([]byte, 32))
	old := ed25519.PublicKey(append(make([]byte, 31), 1))
	doc := &fence.KeySetDocument{Keys: []fence.KeyInfo{fence.NewKeyInfo(cur, true), fence.NewRetiredKeyInfo(old, 41)}}
	want := `{"keys":[{"id":"` + fence.KeyIDOf(cur).String() + `","algorithm":"ed25519","public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","current":true},` +
		`{"id":"` + fence.KeyIDOf(old).String() + `","algorithm":"ed25519","public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAE=","current":false,"max_token":41}]}`
	for _, req := range []request{
		{method: "GET", target: "/api/v1/cluster/token-key"},
		{method: "POST", target: "/api/v1/cluster/token-key/rotate"},
	} {
		f := &fakeService{resp: doc}
		h, _ := newHandler(f, Options{})
		rec := do(h, req)
		if rec.Code != 200 {
			t.Fatalf("%s %s: %d %s", req.method, req.target, rec.Code, rec.Body)
		}
		jsonEqual(t, rec.Body.String(), want)
	}
}
