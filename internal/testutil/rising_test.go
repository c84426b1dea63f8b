package testutil

import "testing"

func TestRising(t *testing.T) {
	if err := Rising(map[string][]uint64{"a": {1, 2, 5}, "b": {3}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]uint64{{1, 1}, {4, 2}} {
		if Rising(map[string][]uint64{"a": bad}) == nil {
			t.Fatalf("%v passed", bad)
		}
	}
}
