package command

import (
	"regexp"
	"strings"
	"testing"
)

func TestNormalizeName(t *testing.T) {
	max := strings.Repeat("a", MaxNameLen)
	maxSegs := strings.Repeat("ab/", MaxNameLen/3) + "cd"
	maxSegs = maxSegs[len(maxSegs)-MaxNameLen:]
	if maxSegs[0] == '/' {
		maxSegs = "x" + maxSegs[1:]
	}
	cases := []struct {
		in   string
		want string // "" means invalid
	}{
		// valid
		{"a", "a"},
		{"/a", "a"},
		{"billing/batch-job", "billing/batch-job"},
		{"/billing/batch-job", "billing/batch-job"},
		{"a.b:c_d-e", "a.b:c_d-e"},
		{"A/Z/0/9", "A/Z/0/9"},
		{"...", "..."},
		{".a", ".a"},
		{"a..", "a.."},
		{"a/.b/..c", "a/.b/..c"},
		{"-", "-"},
		{":", ":"},
		{max, max},
		{"/" + max, max}, // the leading slash is not significant
		{maxSegs, maxSegs},
		// invalid
		{"", ""},
		{"/", ""},
		{"//", ""},
		{"//a", ""},
		{"a//b", ""},
		{"a/", ""},
		{"a/b/", ""},
		{".", ""},
		{"..", ""},
		{"/.", ""},
		{"/..", ""},
		{"./a", ""},
		{"../a", ""},
		{"a/.", ""},
		{"a/..", ""},
		{"a/../b", ""},
		{"a/./b", ""},
		{"a b", ""},
		{" a", ""},
		{"a\t", ""},
		{"a\x00b", ""},
		{"a\nb", ""},
		{"é", ""},
		{"a/é", ""},
		{"a\\b", ""},
		{"a?b", ""},
		{"a#b", ""},
		{"a%2Fb", ""},
		{"a*", ""},
		{"a+b", ""},
		{"a=b", ""},
		{"a@b", ""},
		{"\xff", ""},
		{max + "a", ""},
		{"/" + max + "a", ""},
	}
	for _, tc := range cases {
		got, err := NormalizeName(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("NormalizeName(%.40q) = %q, want error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("NormalizeName(%.40q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

var nameSegment = regexp.MustCompile(`^[A-Za-z0-9._:-]+$`)

// refNormalize is an independent reading of design.md §2's name rule.
func refNormalize(s string) (string, bool) {
	s = strings.TrimPrefix(s, "/")
	if s == "" || len(s) > MaxNameLen {
		return "", false
	}
	for _, seg := range strings.Split(s, "/") {
		if !nameSegment.MatchString(seg) || seg == "." || seg == ".." {
			return "", false
		}
	}
	return s, true
}

func FuzzNormalizeName(f *testing.F) {
	for _, s := range []string{"a", "/a", "billing/batch-job", "a.b:c_d-e", "a//b", "a/../b", "é", "/", "", "a/", strings.Repeat("a", 257)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := NormalizeName(s)
		want, ok := refNormalize(s)
		if ok != (err == nil) || got != want {
			t.Fatalf("NormalizeName(%q) = %q, %v; reference says %q, %v", s, got, err, want, ok)
		}
		if err != nil {
			if got != "" {
				t.Fatalf("error with non-empty result %q", got)
			}
			return
		}
		if strings.HasPrefix(got, "/") || len(got) > MaxNameLen {
			t.Fatalf("NormalizeName(%q) = %q is not canonical", s, got)
		}
		// Canonical form is a fixpoint, and "/"+canonical names the same lock.
		if again, err := NormalizeName(got); err != nil || again != got {
			t.Fatalf("not idempotent: %q -> %q, %v", got, again, err)
		}
		if again, err := NormalizeName("/" + got); err != nil || again != got {
			t.Fatalf("leading slash is significant: %q -> %q, %v", "/"+got, again, err)
		}
		// Every valid name is also a valid list prefix.
		if p, err := ValidatePrefix(got); err != nil || p != got {
			t.Fatalf("ValidatePrefix(%q) = %q, %v", got, p, err)
		}
	})
}

func TestValidatePrefix(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"", "", true},
		{"/", "", true},
		{"a", "a", true},
		{"/a/", "a/", true},
		{"billing/", "billing/", true},
		{"a.b:c_d-e/", "a.b:c_d-e/", true},
		{strings.Repeat("p", MaxNameLen), strings.Repeat("p", MaxNameLen), true},
		{strings.Repeat("p", MaxNameLen+1), "", false},
		{"a b", "", false},
		{"é", "", false},
		{"a?", "", false},
		{"a\x00", "", false},
	}
	for _, tc := range cases {
		got, err := ValidatePrefix(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ValidatePrefix(%.30q) = %q, %v; want %q ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestElectionKeys(t *testing.T) {
	k := ElectionKey("db/primary")
	if name, el := SplitKey(k); !el || name != "db/primary" {
		t.Fatalf("SplitKey(%q) = %q, %v", k, name, el)
	}
	if name, el := SplitKey("db/primary"); el || name != "db/primary" {
		t.Fatalf("SplitKey of a lock = %q, %v", name, el)
	}
	// No lock name can collide with an election key.
	if _, err := NormalizeName(k); err == nil {
		t.Fatalf("election key %q is also a valid lock name", k)
	}
	cases := []struct {
		key string
		ok  bool
	}{
		{"a", true},
		{"billing/batch-job", true},
		{ElectionKey("a"), true},
		{ElectionKey("a/b.c"), true},
		{ElectionKey(strings.Repeat("e", MaxNameLen)), true},
		{"/a", false}, // not normalized
		{"", false},
		{"a//b", false},
		{ElectionKey(""), false},
		{ElectionKey("/a"), false},
		{ElectionKey("a/"), false},
		{ElectionKey(".."), false},
		{ElectionKey(ElectionKey("a")), false},
		{ElectionKey(strings.Repeat("e", MaxNameLen+1)), false},
		{"@e", false},
		{"@x/a", false},
		{"@E/a", false},
		{"@", false},
	}
	for _, tc := range cases {
		if got := ValidKey(tc.key); got != tc.ok {
			t.Errorf("ValidKey(%.40q) = %v, want %v", tc.key, got, tc.ok)
		}
	}
}

func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"a", "@e/a", "@e/", "@e//a", "/a", "a/../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		name, election := SplitKey(key)
		n, err := NormalizeName(name)
		want := err == nil && n == name
		if got := ValidKey(key); got != want {
			t.Fatalf("ValidKey(%q) = %v, want %v", key, got, want)
		}
		if election && ElectionKey(name) != key {
			t.Fatalf("ElectionKey(SplitKey(%q)) = %q", key, ElectionKey(name))
		}
		if !election && want {
			if _, el := SplitKey(ElectionKey(key)); !el {
				t.Fatal("election key of a lock name is not an election")
			}
			if ValidKey(ElectionKey(key)) != true {
				t.Fatalf("ElectionKey(%q) invalid", key)
			}
		}
	})
}
