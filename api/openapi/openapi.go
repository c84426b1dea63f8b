// Package openapi holds the OpenAPI 3.1 description of dlock's HTTP API
// (dlock.yaml, the one source) and its JSON form, which nodes serve at
// GET /api/v1/openapi.json.
package openapi

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	"go.yaml.in/yaml/v3"
)

// YAML is the document as written.
//
//go:embed dlock.yaml
var YAML []byte

var (
	once    sync.Once
	jsonDoc []byte
	jsonErr error
)

// JSON is the document as JSON, with keys in the order they are written
// (converted once; the YAML is embedded, so a failure is a build defect that
// the package's test catches).
func JSON() ([]byte, error) {
	once.Do(func() { jsonDoc, jsonErr = toJSON(YAML) })
	return jsonDoc, jsonErr
}

// toJSON converts a YAML document to JSON, keeping mapping order so that
// the served document reads like the written one.
func toJSON(y []byte) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(y, &root); err != nil {
		return nil, fmt.Errorf("openapi: parse dlock.yaml: %w", err)
	}
	var buf bytes.Buffer
	if err := writeNode(&buf, &root); err != nil {
		return nil, fmt.Errorf("openapi: convert dlock.yaml: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, buf.Bytes(), "", "  "); err != nil {
		return nil, fmt.Errorf("openapi: convert dlock.yaml: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func writeNode(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return fmt.Errorf("line %d: want one document", n.Line)
		}
		return writeNode(buf, n.Content[0])
	case yaml.AliasNode:
		return writeNode(buf, n.Alias)
	case yaml.MappingNode:
		buf.WriteByte('{')
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: a mapping key must be a scalar", k.Line)
			}
			if seen[k.Value] {
				return fmt.Errorf("line %d: key %q given twice", k.Line, k.Value)
			}
			seen[k.Value] = true
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k.Value)
			buf.Write(kb)
			buf.WriteByte(':')
			if err := writeNode(buf, n.Content[i+1]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeNode(buf, c); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case yaml.ScalarNode:
		return writeScalar(buf, n)
	default:
		return fmt.Errorf("line %d: unexpected YAML node", n.Line)
	}
	return nil
}

func writeScalar(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.ShortTag() {
	case "!!null":
		buf.WriteString("null")
	case "!!bool":
		b, err := strconv.ParseBool(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: bad boolean %q", n.Line, n.Value)
		}
		buf.WriteString(strconv.FormatBool(b))
	case "!!int", "!!float":
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.Write(b)
	default:
		b, _ := json.Marshal(n.Value)
		buf.Write(b)
	}
	return nil
}
