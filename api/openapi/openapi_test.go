package openapi

import (
	"encoding/json"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The JSON form says exactly what the YAML says: a generic decode of each
// gives the same value.
func TestJSONMatchesYAML(t *testing.T) {
	j, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal(j, &fromJSON); err != nil {
		t.Fatalf("served JSON does not parse: %v", err)
	}
	if err := yaml.Unmarshal(YAML, &fromYAML); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(fromJSON)
	b, err := json.Marshal(fromYAML)
	if err != nil {
		t.Fatalf("YAML value cannot be JSON: %v", err)
	}
	if string(a) != string(b) {
		t.Fatalf("JSON and YAML differ:\n%s\n%s", a, b)
	}
}

func TestDuplicateKeysAreRefused(t *testing.T) {
	if _, err := toJSON([]byte("a: 1\na: 2\n")); err == nil {
		t.Fatal("a duplicate key was accepted")
	}
}
