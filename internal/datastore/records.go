package datastore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/bbolt"
)

// Record is one accepted write.
type Record struct {
	Lock         string    `json:"lock"`
	ClientID     string    `json:"client_id"`
	FencingToken uint64    `json:"fencing_token"`
	Data         string    `json:"data"`
	At           time.Time `json:"at"`
}

var bucketRecords = []byte("records")

// recordStore appends records in acceptance order to a bbolt file that is
// fsynced on every commit, keyed by a big-endian sequence number.
type recordStore struct{ db *bbolt.DB }

// openRecords opens the records file. The checker's file in the same dir is
// opened first, so a second process on the dir is refused there, clearly.
func openRecords(path string) (*recordStore, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err == nil {
		err = db.Update(func(tx *bbolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(bucketRecords)
			return err
		})
		if err != nil {
			_ = db.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open records file %s: %w", path, err)
	}
	return &recordStore{db: db}, nil
}

func (s *recordStore) close() error { return s.db.Close() }

func (s *recordStore) append(r Record) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketRecords)
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		return b.Put(binary.BigEndian.AppendUint64(nil, seq), v)
	})
}

// list returns the newest limit records (of lock, if not empty) in the
// order they were accepted, and whether older ones were left out.
func (s *recordStore) list(lock string, limit int) (recs []Record, truncated bool, err error) {
	recs = []Record{}
	err = s.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketRecords).Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("record %x is unreadable: %w", k, err)
			}
			if lock != "" && r.Lock != lock {
				continue
			}
			if len(recs) == limit {
				truncated = true
				return nil
			}
			recs = append(recs, r)
		}
		return nil
	})
	slices.Reverse(recs)
	return recs, truncated, err
}
