package fence

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"go.etcd.io/bbolt"
)

// Limits on Check's arguments. bbolt allows larger keys, but a key or holder
// this long is a bug in the caller, not a resource name.
const (
	MaxKeyLen    = 1024
	MaxHolderLen = 1024
)

var (
	// ErrStaleToken: a write with a higher token (or with the same token,
	// from another holder) was already accepted for this key. The writer has
	// lost its lock and must stop; a *StaleTokenError says what was seen.
	ErrStaleToken = errors.New("fence: stale fencing token")
	// ErrInvalidCheck: a bad argument to Check (token 0, empty key or holder,
	// or one over its limit). Nothing was recorded.
	ErrInvalidCheck = errors.New("fence: invalid check")
)

// StaleTokenError is the error of a refused Check; it matches
// errors.Is(err, ErrStaleToken).
type StaleTokenError struct {
	Key     string
	Token   uint64 // the token that was refused
	Highest uint64 // the highest token accepted so far for Key
}

func (e *StaleTokenError) Error() string {
	if e.Token == e.Highest {
		return fmt.Sprintf("fence: token %d for %q was already used by another holder; this writer does not hold the lock: stop and acquire it again", e.Token, e.Key)
	}
	return fmt.Sprintf("fence: token %d for %q is stale: token %d was already accepted, so this writer has lost the lock: stop and acquire it again", e.Token, e.Key, e.Highest)
}

// Is makes errors.Is(err, ErrStaleToken) true.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

var bucketHighest = []byte("fence-highest")

// valueV1 tags the stored value's layout: version byte, token (8 bytes,
// big-endian), holder. A later layout gets a new version byte.
const valueV1 = 1

// Option configures Open.
type Option func(*options)

type options struct{ openTimeout time.Duration }

// WithOpenTimeout bounds how long Open waits for the file lock held by
// another Checker on the same file (default 5 s). bbolt would wait forever.
func WithOpenTimeout(d time.Duration) Option { return func(o *options) { o.openTimeout = d } }

// Checker remembers, per key, the highest fencing token accepted and the
// holder that wrote with it, in a bbolt file that is fsynced on every
// accepted token. It is safe for concurrent use; one file can be open in one
// Checker (one process) at a time.
type Checker struct {
	db *bbolt.DB
}

// Open opens or creates the checker file at path. The directory must exist.
func Open(path string, opts ...Option) (*Checker, error) {
	o := options{openTimeout: 5 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: o.openTimeout})
	if err != nil {
		if errors.Is(err, bbolt.ErrTimeout) {
			return nil, fmt.Errorf("fence: open %s: another process has it open; stop it or use another file: %w", path, err)
		}
		return nil, fmt.Errorf("fence: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketHighest)
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("fence: initialise %s: %w", path, err)
	}
	// bbolt fsyncs the file but not the directory entry that names it: a
	// power loss right after creating it could lose the file, and with it
	// every token accepted since. Once per Open is cheap.
	if err := syncDir(filepath.Dir(path)); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("fence: sync the directory of %s: %w", path, err)
	}
	return &Checker{db: db}, nil
}

// syncDir fsyncs a directory, so the entries created in it survive a power
// loss. Windows cannot open a directory for syncing (and NTFS journals
// its metadata), so there it does nothing.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if errors.Is(err, syscall.EINVAL) {
		// Some file systems (certain network and FUSE mounts) do not
		// sync directories at all; there is nothing more to do there.
		err = nil
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes the file. Checks after Close fail.
func (c *Checker) Close() error { return c.db.Close() }

// Check decides, in one transaction, whether a write with token by holder may
// go ahead for key:
//
//   - token > highest seen for key: accepted; token and holder are recorded
//     (and on disk) before Check returns.
//   - token == highest and holder is the recorded holder: accepted, nothing
//     changes. This is the same grant writing again.
//   - otherwise: a *StaleTokenError (errors.Is ErrStaleToken), nothing changes.
//
// holder names who writes with the token, e.g. client id plus the lease reference. A
// correct cluster never gives one token to two holders, so an equal token
// from someone else is a forgery or a bug, and is refused. Token 0 is never
// valid (dlock's first token is 1).
func (c *Checker) Check(key string, token uint64, holder string) error {
	if err := validCheck(key, token, holder); err != nil {
		return err
	}
	err := c.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketHighest)
		highest, h, ok, err := decodeValue(b.Get([]byte(key)))
		switch {
		case err != nil:
			return err
		case !ok || token > highest:
			return b.Put([]byte(key), encodeValue(token, holder))
		case token == highest && holder == h:
			return nil
		}
		return &StaleTokenError{Key: key, Token: token, Highest: highest}
	})
	if err != nil && !errors.Is(err, ErrStaleToken) {
		return fmt.Errorf("fence: record token %d for %q: %w", token, key, err)
	}
	return err
}

func validCheck(key string, token uint64, holder string) error {
	switch {
	case token == 0:
		return fmt.Errorf("%w: token 0 is not a fencing token (tokens start at 1)", ErrInvalidCheck)
	case key == "" || len(key) > MaxKeyLen:
		return fmt.Errorf("%w: key must be 1 to %d bytes, got %d", ErrInvalidCheck, MaxKeyLen, len(key))
	case holder == "" || len(holder) > MaxHolderLen:
		return fmt.Errorf("%w: holder must be 1 to %d bytes, got %d", ErrInvalidCheck, MaxHolderLen, len(holder))
	}
	return nil
}

// Highest returns the highest token accepted for key and its holder; ok is
// false if none was (or the checker is closed, or the entry is unreadable).
func (c *Checker) Highest(key string) (token uint64, holder string, ok bool) {
	_ = c.db.View(func(tx *bbolt.Tx) error {
		var err error
		token, holder, ok, err = decodeValue(tx.Bucket(bucketHighest).Get([]byte(key)))
		return err
	})
	return token, holder, ok
}

func encodeValue(token uint64, holder string) []byte {
	v := make([]byte, 0, 9+len(holder))
	v = append(v, valueV1)
	v = binary.BigEndian.AppendUint64(v, token)
	return append(v, holder...)
}

// decodeValue copies out of v, which bbolt owns only for the transaction.
// A value of an unknown layout is an error, never "absent": reading it as
// absent would let any token through.
func decodeValue(v []byte) (token uint64, holder string, ok bool, err error) {
	if v == nil {
		return 0, "", false, nil
	}
	if len(v) < 9 || v[0] != valueV1 {
		return 0, "", false, fmt.Errorf("stored entry has an unknown layout (%d bytes); the file is corrupt or was written by a newer fence package", len(v))
	}
	return binary.BigEndian.Uint64(v[1:9]), string(v[9:]), true, nil
}
