package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/coder/websocket"

	"github.com/dlock/dlock/internal/apierror"
)

// The WebSocket side of the workload: the lock calls of wsClient clients go
// over /api/v1/ws, one connection per attempt, through the same retry loop
// as HTTP. The connection closes when the attempt ends — on its answer, or
// at its deadline, which is how a waiting acquire that gave up withdraws its
// wait (the server sees the client go away). Answers are turned back into
// the HTTP status and JSON the suite reads, as for gRPC.

// wsSend makes one attempt of a lock call over a WebSocket to node. handled
// is false for a call it does not carry.
func wsSend(ctx context.Context, url string, method, path string, body any) (code int, answer []byte, handled bool, err error) {
	name, action, ok := lockCall(method, path)
	if !ok {
		return 0, nil, false, nil
	}
	msg := map[string]any{"id": "1", "op": action, "name": name}
	switch b := body.(type) {
	case acquireBody:
		if action != "acquire" {
			return 0, nil, false, nil
		}
		msg["client_id"], msg["request_id"] = b.ClientID, b.RequestID
		if b.SessionID != "" {
			msg["session_id"] = b.SessionID
		} else {
			msg["ttl_ms"] = b.TTLms
		}
		if b.WaitTimeoutMs > 0 {
			msg["wait_timeout_ms"] = b.WaitTimeoutMs
		}
		if b.Takeover {
			msg["takeover"] = true
		}
		if b.Limit != 0 {
			msg["limit"] = b.Limit
		}
		if b.Mode != "" {
			msg["mode"] = b.Mode
		}
		if b.Subtree {
			msg["subtree"] = true
		}
	case tokenBody:
		if action != "release" && action != "renew" {
			return 0, nil, false, nil
		}
		msg["client_id"], msg["request_id"] = b.ClientID, b.RequestID
		msg["fencing_token"], msg["lease_id"] = b.FencingToken, b.LeaseID
	default:
		return 0, nil, false, nil
	}
	conn, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/api/v1/ws", nil)
	if err != nil {
		return 0, nil, true, errors.New("websocket: " + err.Error())
	}
	defer conn.CloseNow()
	out, err := json.Marshal(msg)
	if err != nil {
		return 0, nil, true, err
	}
	if err := conn.Write(ctx, websocket.MessageText, out); err != nil {
		return 0, nil, true, errors.New("websocket: " + err.Error())
	}
	for {
		_, data, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return 0, nil, true, context.DeadlineExceeded
			}
			return 0, nil, true, errors.New("websocket: " + err.Error())
		}
		var ans struct {
			ID           string          `json:"id"`
			Result       json.RawMessage `json:"result"`
			Error        *apiError       `json:"error"`
			Holder       json.RawMessage `json:"holder"`
			FencingToken uint64          `json:"fencing_token"`
			Limit        int             `json:"limit"`
		}
		if err := json.Unmarshal(data, &ans); err != nil || ans.ID != "1" {
			continue // not the answer to this call
		}
		_ = conn.Close(websocket.StatusNormalClosure, "")
		if ans.Error == nil {
			return 200, ans.Result, true, nil
		}
		if code := apierror.HTTPStatus(apierror.Code(ans.Error.Code)); code == 503 || code == 429 {
			return code, data, true, nil
		}
		conflict := map[string]any{"error": ans.Error}
		if ans.Limit != 0 {
			conflict["limit"] = ans.Limit
		}
		if len(ans.Holder) > 0 {
			conflict["holder"] = ans.Holder
		}
		if ans.FencingToken != 0 {
			conflict["fencing_token"] = ans.FencingToken
		}
		b, err := json.Marshal(conflict)
		return apierror.HTTPStatus(apierror.Code(ans.Error.Code)), b, true, err
	}
}
