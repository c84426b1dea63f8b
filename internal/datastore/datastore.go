// Package datastore is the example "data store" of the fencing story, made safe: an HTTP service
// that appends records written under a dlock lock, and refuses any write
// whose fencing token is stale or whose token proof does not verify. It is an
// example of a fenced resource built on package fence, run by
// `dlock datastore`.
package datastore

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/dlock/dlock/fence"
)

// Files in Config.DataDir.
const (
	checkerFile = "fence.db"
	recordsFile = "records.db"
)

// Config configures a Server.
type Config struct {
	// DataDir holds the highest-token file and the records. Created if
	// missing; one Server at a time may use it.
	DataDir string
	// KeySet verifies token proofs. It may be nil only with InsecureNoProof;
	// SetKeySet replaces it later (after a key rotation).
	KeySet *fence.KeySet
	// InsecureNoProof accepts any fencing token without a proof. Only for
	// showing what goes wrong without proofs: any client can then claim a
	// huge token and lock every honest writer out of that lock for good.
	InsecureNoProof bool
	Logger          *slog.Logger
}

// Server is the fenced data store. Its handler is safe for concurrent use.
type Server struct {
	log      *slog.Logger
	insecure bool
	keys     atomic.Pointer[fence.KeySet]
	checker  *fence.Checker
	records  *recordStore

	// writeMu keeps the token check and the append in one order: were they
	// separate, a write with token 5 checked just before one with token 6
	// could still be appended after it, and a reader taking the newest record
	// would see the stale data win.
	writeMu sync.Mutex
	// afterCheck, if set (tests only), runs between the check and the append.
	afterCheck func()

	closeOnce sync.Once
	closeErr  error
}

// New opens (or creates) the data store in cfg.DataDir.
func New(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("datastore: DataDir is required")
	}
	if cfg.KeySet == nil && !cfg.InsecureNoProof {
		return nil, errors.New("datastore: no KeySet to verify token proofs with; fetch the cluster's with fence.FetchKeySet, or set InsecureNoProof to run unprotected (for comparison only)")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("datastore: create data dir: %w", err)
	}
	checker, err := fence.Open(filepath.Join(cfg.DataDir, checkerFile))
	if err != nil {
		return nil, fmt.Errorf("datastore: %w", err)
	}
	records, err := openRecords(filepath.Join(cfg.DataDir, recordsFile))
	if err != nil {
		_ = checker.Close()
		return nil, fmt.Errorf("datastore: %w", err)
	}
	s := &Server{log: log, insecure: cfg.InsecureNoProof, checker: checker, records: records}
	s.keys.Store(cfg.KeySet)
	if s.insecure {
		log.Warn("INSECURE: token proofs are NOT checked (--insecure-no-proof); any client can send any fencing token, and one huge token locks every honest writer out of its lock for good. Use only for comparison.")
	}
	return s, nil
}

// SetKeySet replaces the trusted keys, e.g. after a refresh from the
// cluster. A nil set is ignored: a failed refresh must not leave the store
// trusting nothing.
func (s *Server) SetKeySet(ks *fence.KeySet) {
	if ks != nil {
		s.keys.Store(ks)
	}
}

// Handler serves POST /write, GET /data and GET /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/write", s.handleWrite)
	mux.HandleFunc("/data", s.handleData)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"ok": true})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "no such path; the data store serves POST /write and GET /data")
	})
	return mux
}

// Close closes the files; later calls return the first result. Stop the
// HTTP server first: writes after Close fail with 500.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = errors.Join(s.checker.Close(), s.records.close())
	})
	return s.closeErr
}
