package wsapi

import (
	"encoding/json"
	"testing"

	"github.com/dlock/dlock/internal/apierror"
)

// FuzzDecode feeds arbitrary client messages to the strict decoder: it never
// panics, refuses with invalid_argument, and anything it accepts has an id, a
// known op and only that op's fields.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"1","op":"acquire","name":"a/b","client_id":"c","ttl_ms":5000,"wait_timeout_ms":1000}`,
		`{"id":"2","op":"release","name":"a","client_id":"c","fencing_token":3,"lease_id":"00"}`,
		`{"id":"3","op":"watch","prefix":"a/","from_revision":7}`,
		`{"id":"4","op":"unwatch","target":"3"}`,
		`{"id":"5","op":"cancel","target":"1"}`,
		`{"id":"6","op":"acquire","id":"7"}`,
		`{"op":"nope"}`, `[]`, `null`, `{"id":1}`, "\xff", `{"id":"x","op":"renew","ttl_ms":"5"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if m == nil {
			t.Fatalf("decode returned no message for %q", b)
		}
		if err != nil {
			if c := apierror.CodeOf(err); c != apierror.InvalidArgument {
				t.Fatalf("refusal code %q for %q", c, b)
			}
			return
		}
		if m.ID == "" || len(m.ID) > maxID {
			t.Fatalf("accepted message without a valid id: %q", b)
		}
		allowed, ok := fields[m.Op]
		if !ok {
			t.Fatalf("accepted unknown op %q", m.Op)
		}
		var raw map[string]json.RawMessage
		if json.Unmarshal(b, &raw) != nil {
			t.Fatalf("accepted a message that is not a JSON object: %q", b)
		}
		for k := range raw {
			found := false
			for _, a := range allowed {
				found = found || a == k
			}
			if !found {
				t.Fatalf("accepted field %q for op %s", k, m.Op)
			}
		}
	})
}
