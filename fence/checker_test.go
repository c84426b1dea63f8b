package fence

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTemp(t *testing.T) (*Checker, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fence.db")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, path
}

func TestCheckRules(t *testing.T) {
	// Every case starts from key "k" at token 5 by holder "a".
	tests := []struct {
		name        string
		key         string
		token       uint64
		holder      string
		wantErr     error
		wantHighest uint64
		wantHolder  string
	}{
		{"greater", "k", 6, "b", nil, 6, "b"},
		{"much greater", "k", 1 << 62, "b", nil, 1 << 62, "b"},
		{"equal, same holder", "k", 5, "a", nil, 5, "a"},
		{"equal, other holder", "k", 5, "b", ErrStaleToken, 5, "a"},
		{"lower", "k", 4, "a", ErrStaleToken, 5, "a"},
		{"lower, other holder", "k", 1, "b", ErrStaleToken, 5, "a"},
		{"zero", "k", 0, "a", ErrInvalidCheck, 5, "a"},
		{"empty holder", "k", 6, "", ErrInvalidCheck, 5, "a"},
		{"holder too long", "k", 6, strings.Repeat("h", MaxHolderLen+1), ErrInvalidCheck, 5, "a"},
		{"other key is independent", "other", 1, "b", nil, 5, "a"},
		{"empty key", "", 6, "a", ErrInvalidCheck, 5, "a"},
		{"key too long", strings.Repeat("k", MaxKeyLen+1), 6, "a", ErrInvalidCheck, 5, "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := openTemp(t)
			if err := c.Check("k", 5, "a"); err != nil {
				t.Fatal(err)
			}
			err := c.Check(tt.key, tt.token, tt.holder)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Check(%q, %d, %q) = %v, want %v", tt.key, tt.token, tt.holder, err, tt.wantErr)
			}
			if errors.Is(err, ErrStaleToken) {
				var se *StaleTokenError
				if !errors.As(err, &se) || se.Highest != 5 || se.Token != tt.token || se.Key != tt.key {
					t.Errorf("error %#v, want *StaleTokenError{Key:%q, Token:%d, Highest:5}", err, tt.key, tt.token)
				}
			}
			tok, h, ok := c.Highest("k")
			if !ok || tok != tt.wantHighest || h != tt.wantHolder {
				t.Errorf("Highest(k) = %d, %q, %v; want %d, %q", tok, h, ok, tt.wantHighest, tt.wantHolder)
			}
		})
	}
}

func TestHighestUnknownKey(t *testing.T) {
	c, _ := openTemp(t)
	if tok, h, ok := c.Highest("nobody"); ok || tok != 0 || h != "" {
		t.Errorf("Highest of an unseen key = %d, %q, %v; want 0, \"\", false", tok, h, ok)
	}
}

func TestCheckSurvivesReopen(t *testing.T) {
	c, path := openTemp(t)
	if err := c.Check("billing/job", 41, "w1/lease"); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Check("billing/job", 42, "w2"); err == nil {
		t.Fatal("Check after Close succeeded")
	}
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tok, h, ok := c.Highest("billing/job"); !ok || tok != 41 || h != "w1/lease" {
		t.Fatalf("after reopen Highest = %d, %q, %v; want 41, w1/lease", tok, h, ok)
	}
	if err := c.Check("billing/job", 40, "w0"); !errors.Is(err, ErrStaleToken) {
		t.Errorf("lower token after reopen: %v, want ErrStaleToken", err)
	}
	if err := c.Check("billing/job", 41, "w1/lease"); err != nil {
		t.Errorf("same grant after reopen: %v, want accepted", err)
	}
}

func TestOpenLockedFileTimesOut(t *testing.T) {
	_, path := openTemp(t)
	start := time.Now()
	if _, err := Open(path, WithOpenTimeout(50*time.Millisecond)); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second Open of a file in use: %v, want a timeout naming another process", err)
	}
	// The option bounds the wait: the default (5 s) would be far longer.
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Open with a 50ms timeout gave up after %s", el)
	}
}

// TestConcurrentChecks races many writers with shuffled tokens; the race
// detector checks the Checker, and the result must be exactly the maximum,
// with every refusal reporting a highest above the refused token.
func TestConcurrentChecks(t *testing.T) {
	c, _ := openTemp(t)
	const writers, perWriter = 16, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers*perWriter)
	for w := range writers {
		wg.Go(func() {
			for _, i := range rand.Perm(perWriter) {
				token := uint64(i*writers + w + 1) // unique per writer
				holder := fmt.Sprintf("w%d", w)
				err := c.Check("shared", token, holder)
				var se *StaleTokenError
				switch {
				case err == nil:
				case errors.As(err, &se):
					if se.Highest <= token {
						errs <- fmt.Errorf("token %d refused with highest %d", token, se.Highest)
					}
				default:
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	const max = writers * perWriter
	if tok, h, ok := c.Highest("shared"); !ok || tok != max || h != fmt.Sprintf("w%d", (max-1)%writers) {
		t.Errorf("Highest = %d, %q, %v; want %d", tok, h, ok, max)
	}
}

// Open syncs the directory that holds the new file, so its name survives a
// power loss; a directory that cannot be opened is an error, not skipped.
func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(filepath.Join(dir, "f.db"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := syncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := syncDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("syncDir of a missing directory succeeded")
	}
	if _, err := Open(filepath.Join(dir, "missing", "f.db")); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}
