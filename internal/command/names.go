package command

import (
	"errors"
	"fmt"
	"strings"
)

// MaxNameLen bounds a lock or election name.
const MaxNameLen = 256

// NormalizeName checks a lock name against design.md §2 and returns its canonical
// form (no leading slash): slash-separated segments of [A-Za-z0-9._:-]+, never
// "." or "..", no empty segments, at most 256 bytes.
func NormalizeName(s string) (string, error) {
	s = strings.TrimPrefix(s, "/")
	if s == "" {
		return "", errors.New("lock name is empty")
	}
	if len(s) > MaxNameLen {
		return "", fmt.Errorf("lock name is %d bytes; the limit is %d", len(s), MaxNameLen)
	}
	for seg := range strings.SplitSeq(s, "/") {
		if seg == "" {
			return "", errors.New("lock name has an empty segment (a double or trailing slash)")
		}
		if seg == "." || seg == ".." {
			return "", fmt.Errorf("lock name segment %q is not allowed", seg)
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
				return "", fmt.Errorf("lock name has character %q; segments may use only A-Z a-z 0-9 . _ : -", c)
			}
		}
	}
	return s, nil
}

// ValidatePrefix checks a list/watch prefix: empty, or a name prefix whose
// characters are allowed in names (a trailing slash is fine).
func ValidatePrefix(p string) (string, error) {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return "", nil
	}
	if len(p) > MaxNameLen {
		return "", fmt.Errorf("prefix is %d bytes; the limit is %d", len(p), MaxNameLen)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-' || c == '/') {
			return "", fmt.Errorf("prefix has character %q; use only A-Z a-z 0-9 . _ : - /", c)
		}
	}
	return p, nil
}

// electionPrefix puts election keys in their own namespace inside the lock
// table: '@' is not allowed in lock names, so no lock can collide with an
// election and no lock call can touch one.
const electionPrefix = "@e/"

// ElectionKey is the lock-table key of an election with a normalized name.
func ElectionKey(name string) string { return electionPrefix + name }

// SplitKey tells a lock-table key's kind: an election (with its name) or a lock.
func SplitKey(key string) (name string, election bool) {
	if strings.HasPrefix(key, electionPrefix) {
		return key[len(electionPrefix):], true
	}
	return key, false
}

// ValidKey reports whether key is a normalized lock name or election key.
func ValidKey(key string) bool {
	name, _ := SplitKey(key)
	n, err := NormalizeName(name)
	return err == nil && n == name
}

// TopSegment is the top-level segment of a lock-table key or a name: the
// part of the name (an election's own name) before its first "/". Shard
// ranges are over it, so a name and everything below it share a shard.
func TopSegment(key string) string {
	name, _ := SplitKey(key)
	name = strings.TrimPrefix(name, "/")
	if i := strings.IndexByte(name, '/'); i >= 0 {
		return name[:i]
	}
	return name
}
