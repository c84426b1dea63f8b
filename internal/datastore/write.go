package datastore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/dlock/dlock/fence"
	"github.com/dlock/dlock/internal/command"
)

// Limits on requests.
const (
	MaxBodyBytes = 64 << 10
	MaxDataBytes = 32 << 10
)

type writeRequest struct {
	ClientID     string  `json:"client_id"`
	Lock         string  `json:"lock"`
	FencingToken uint64  `json:"fencing_token"`
	LeaseRef     string  `json:"lease_ref"`
	TokenProof   string  `json:"token_proof"`
	Data         *string `json:"data"`
}

func (s *Server) handleWrite(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", "use POST /write with a JSON body")
		return
	}
	req, err := decodeWrite(w, r)
	if err == nil {
		err = req.validate(s.insecure)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalid, err.Error())
		return
	}
	if !s.insecure {
		if err := s.keys.Load().Verify(req.Lock, req.FencingToken, req.ClientID, req.LeaseRef, req.TokenProof); err != nil {
			s.log.Warn("refused a write with a bad token proof", "lock", req.Lock, "client_id", req.ClientID, "fencing_token", req.FencingToken, "error", err)
			writeError(w, http.StatusForbidden, codeBadProof, "write refused: "+err.Error())
			return
		}
	}
	err = s.checkAndAppend(req)
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		s.log.Info("refused a stale write", "lock", req.Lock, "client_id", req.ClientID, "fencing_token", req.FencingToken, "highest_token", stale.Highest)
		writeJSON(w, http.StatusConflict, staleReply{HighestToken: stale.Highest, Error: errorBody{codeStaleToken, stale.Error()}})
	case errors.Is(err, fence.ErrInvalidCheck):
		writeError(w, http.StatusBadRequest, codeInvalid, err.Error())
	case err != nil:
		s.log.Error("write failed", "lock", req.Lock, "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "the write was not stored: "+err.Error()+"; retry, and see the data store's log")
	default:
		s.log.Debug("accepted a write", "lock", req.Lock, "client_id", req.ClientID, "fencing_token", req.FencingToken)
		writeJSON(w, http.StatusOK, writeReply{Accepted: true, HighestToken: req.FencingToken, InsecureNoProof: s.insecure})
	}
}

// checkAndAppend records the token, then the data. A crash between the two
// leaves the token recorded without its data; the writer's retry is the same
// grant (same token and holder), which the checker accepts again.
func (s *Server) checkAndAppend(req *writeRequest) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.checker.Check(req.Lock, req.FencingToken, req.ClientID+"/"+req.LeaseRef); err != nil {
		return err
	}
	if s.afterCheck != nil {
		s.afterCheck()
	}
	return s.records.append(Record{Lock: req.Lock, ClientID: req.ClientID, FencingToken: req.FencingToken, Data: *req.Data, At: time.Now().UTC().Truncate(time.Millisecond)})
}

func decodeWrite(w http.ResponseWriter, r *http.Request) (*writeRequest, error) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		// Refusing form and text posts keeps browsers from writing here
		// cross-site without a CORS preflight.
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return nil, fmt.Errorf("Content-Type %q is not application/json; send JSON (curl --json)", ct)
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, fmt.Errorf("request body is over %d bytes; keep data under %d bytes", MaxBodyBytes, MaxDataBytes)
		}
		return nil, fmt.Errorf("could not read the request body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req writeRequest
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf(`request body is not a valid write (want {"client_id","lock","fencing_token","lease_ref","token_proof","data"}): %w`, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("request body has data after the JSON object; send exactly one object")
	}
	return &req, nil
}

// validate checks every field and puts lock and lease reference in the
// canonical form the cluster signs (no leading slash; lowercase hex).
func (req *writeRequest) validate(insecure bool) error {
	if err := checkClientID(req.ClientID); err != nil {
		return err
	}
	lock, err := normalizeLock(req.Lock)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	req.Lock = lock
	if req.FencingToken == 0 {
		return errors.New("fencing_token is required: send the token of your lock grant (tokens start at 1)")
	}
	ref := strings.ToLower(req.LeaseRef)
	if len(ref) != 32 || strings.Trim(ref, "0123456789abcdef") != "" {
		return errors.New("lease_ref must be 32 hex digits: send the lease_ref of your lock grant (never its lease_id, which can release the lock)")
	}
	req.LeaseRef = ref
	if req.TokenProof == "" && !insecure {
		return errors.New("token_proof is required: send the token_proof of your lock grant unchanged")
	}
	if req.Data == nil {
		return errors.New(`data is required (it may be "")`)
	}
	if len(*req.Data) > MaxDataBytes {
		return fmt.Errorf("data is %d bytes; the limit is %d", len(*req.Data), MaxDataBytes)
	}
	return nil
}

// normalizeLock gives the lock-table key the cluster signs: the canonical
// lock name, or "@e/" and the canonical name for an election's leader. One
// key per lock matters beyond proofs: were "/a" and "a" two keys, a stale
// writer without proofs could dodge the check by respelling the name.
func normalizeLock(s string) (string, error) {
	name, election := command.SplitKey(s)
	name, err := command.NormalizeName(name)
	if err != nil {
		return "", err
	}
	if election {
		return command.ElectionKey(name), nil
	}
	return name, nil
}

// checkClientID applies the cluster's client_id rule, so every id the
// cluster accepts is accepted here and nothing else is.
func checkClientID(id string) error {
	if id == "" || len(id) > command.MaxClientID {
		return fmt.Errorf("client_id must be 1 to %d characters, got %d", command.MaxClientID, len(id))
	}
	for _, c := range []byte(id) {
		if c < 0x21 || c > 0x7e {
			return errors.New("client_id may contain only printable ASCII without spaces")
		}
	}
	return nil
}
