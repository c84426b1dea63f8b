package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
)

// grant is what a holder sends the data store to prove its right to write.
type grant struct {
	ClientID     string `json:"client_id"`
	Lock         string `json:"lock"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseRef     string `json:"lease_ref"`
	TokenProof   string `json:"token_proof"`
}

type writeRequest struct {
	grant
	Data string `json:"data"`
}

// storeAnswer is the data store's answer to POST /write, with its HTTP
// status (the writer child passes it on to the demo as JSON, status too).
type storeAnswer struct {
	Status       int    `json:"status"`
	Accepted     bool   `json:"accepted"`
	HighestToken uint64 `json:"highest_token"`
	Error        *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

func (a storeAnswer) code() string {
	if a.Error == nil {
		return ""
	}
	return a.Error.Code
}

// String is the answer as the narration shows it: "200 accepted",
// "409 stale_token (highest token 8)".
func (a storeAnswer) String() string {
	switch {
	case a.Accepted:
		return fmt.Sprintf("%d accepted", a.Status)
	case a.code() == "stale_token":
		return fmt.Sprintf("%d stale_token (highest token %d)", a.Status, a.HighestToken)
	case a.Error != nil:
		return fmt.Sprintf("%d %s", a.Status, a.Error.Code)
	}
	return fmt.Sprintf("%d (no error code)", a.Status)
}

// record is one accepted write as GET /data lists it.
type record struct {
	Lock         string `json:"lock"`
	ClientID     string `json:"client_id"`
	FencingToken uint64 `json:"fencing_token"`
	Data         string `json:"data"`
}

func (r record) String() string {
	return fmt.Sprintf("%-3s token %-3d %-8s %q", r.Lock, r.FencingToken, r.ClientID, r.Data)
}

// postWrite sends one write; any answer with a JSON body is an answer, an
// error only means the store could not be asked.
func postWrite(ctx context.Context, hc *http.Client, storeURL string, w writeRequest) (storeAnswer, error) {
	body, err := json.Marshal(w)
	if err != nil {
		return storeAnswer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, storeURL+"/write", bytes.NewReader(body))
	if err != nil {
		return storeAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return storeAnswer{}, fmt.Errorf("POST %s/write: %w", storeURL, err)
	}
	defer resp.Body.Close()
	var a storeAnswer
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(b, &a); err != nil {
		return storeAnswer{}, fmt.Errorf("POST %s/write: %s with a body that is not JSON: %q", storeURL, resp.Status, b)
	}
	a.Status = resp.StatusCode
	return a, nil
}

// startStore starts `dlock datastore` against the first node and waits
// until it serves: it listens only once it has the cluster's keys.
func (e *env) startStore(ctx context.Context) error {
	p, err := e.startProc("datastore", []string{"datastore", "--addr", strings.TrimPrefix(e.storeURL, "http://"),
		"--data-dir", filepath.Join(e.dir, "datastore"), "--cluster", e.nodes[0].url(), "--log-level", "warn"}, nil)
	if err != nil {
		return err
	}
	e.store = p
	return e.waitUntil(ctx, "the data store (GET /healthz)", p, func() (bool, error) {
		err := e.getJSON(ctx, e.storeURL+"/healthz", nil)
		return err == nil, err
	})
}

// write sends a write and remembers it if it was accepted.
func (e *env) write(ctx context.Context, g grant, data string) (storeAnswer, error) {
	a, err := postWrite(ctx, e.hc, e.storeURL, writeRequest{grant: g, Data: data})
	if err == nil {
		e.noteAnswer(g, data, a)
	}
	return a, err
}

func (e *env) noteAnswer(g grant, data string, a storeAnswer) {
	if a.Accepted {
		e.accepted = append(e.accepted, record{Lock: g.Lock, ClientID: g.ClientID, FencingToken: g.FencingToken, Data: data})
	}
}

// mustWrite is a write by the rightful holder: it must be accepted.
func (e *env) mustWrite(ctx context.Context, g grant, data string) error {
	a, err := e.write(ctx, g, data)
	if err != nil {
		return fmt.Errorf("%s's write: %w", g.ClientID, err)
	}
	e.say("%s wrote %q to the data store with token %d: %s", g.ClientID, data, g.FencingToken, a)
	if !a.Accepted {
		return fmt.Errorf("%s holds %s with token %d, yet the data store answered %s, want 200 accepted", g.ClientID, g.Lock, g.FencingToken, a)
	}
	return nil
}

// storedRecords is GET /data.
func (e *env) storedRecords(ctx context.Context) ([]record, error) {
	var out struct {
		Records   []record `json:"records"`
		Truncated bool     `json:"truncated"`
	}
	if err := e.getJSON(ctx, e.storeURL+"/data", &out); err != nil {
		return nil, err
	}
	if out.Truncated {
		return nil, fmt.Errorf("GET /data left records out; the demo writes far fewer than its limit")
	}
	return out.Records, nil
}
