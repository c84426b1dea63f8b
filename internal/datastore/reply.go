package datastore

import (
	"encoding/json"
	"net/http"
)

// Error codes of the data store's answers.
const (
	codeInvalid    = "invalid_argument"
	codeBadProof   = "bad_proof"
	codeStaleToken = "stale_token"
)

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type errorReply struct {
	Error errorBody `json:"error"`
}

// staleReply also says which token won, so a client can tell how far
// behind it is.
type staleReply struct {
	Accepted     bool      `json:"accepted"`
	HighestToken uint64    `json:"highest_token"`
	Error        errorBody `json:"error"`
}

type writeReply struct {
	Accepted     bool   `json:"accepted"`
	HighestToken uint64 `json:"highest_token"`
	// InsecureNoProof is set when the token was taken on trust, so that
	// nobody mistakes an unprotected store for a protected one.
	InsecureNoProof bool `json:"insecure_no_proof,omitempty"`
}

type dataReply struct {
	Records   []Record `json:"records"`
	Truncated bool     `json:"truncated"`
}

// writeJSON marshals first, so an unencodable value becomes a clean 500
// rather than a half-written answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(errorReply{errorBody{"internal", "could not encode the answer: " + err.Error()}})
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, errorReply{errorBody{code, message}})
}
