package openapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	apidoc "github.com/dlock/dlock/api/openapi"
	"github.com/dlock/dlock/internal/apierror"
	"github.com/dlock/dlock/internal/shard"
	"github.com/dlock/dlock/internal/testcluster"
	"github.com/dlock/dlock/internal/testutil"
)

// notAlwaysSent lists the answer fields the contract test cannot make a
// cluster send, with the reason; every other declared field must be seen.
var notAlwaysSent = map[string]string{
	"ShardInfo.leaving": "only while a replica move is in flight, which needs several nodes (internal/shard's TestMoveUnderLoad)",
	"Member.removing":   "only while a sharded member's removal is held between its two steps, which needs a joined node (internal/shard's TestClusterShowsRemoving)",
}

// contract drives one cluster and records what it saw.
type contract struct {
	t     *testing.T
	doc   *openapi3.T
	c     *testcluster.Cluster
	token string
	hc    *http.Client

	mu sync.Mutex
	// seen: schema → its fields seen in answers. A schema is named by its
	// component ("Holder"), or by where it sits inside one ("Member.reachable"
	// is not a schema; "ClusterInfo.members[]" would be an inline one).
	seen map[string]map[string]bool
	// reached: the schemas answers were checked against, with the fields
	// each declares.
	reached map[string]*openapi3.Schema
	// ops: operationIds driven.
	ops map[string]bool
}

type op struct {
	route *routers.Route
}

func (k *contract) find(opID string) *routers.Route {
	k.t.Helper()
	for path, item := range k.doc.Paths.Map() {
		for method, o := range item.Operations() {
			if o.OperationID == opID {
				return &routers.Route{Spec: k.doc, Path: path, PathItem: item, Method: method, Operation: o}
			}
		}
	}
	k.fatalf("no operation %q in the document", opID)
	return nil
}

// fatalf fails the test and ends the calling goroutine, which may be one
// of the test's own (a stream, a waiter): t.Fatalf is for the test's
// goroutine only. Callers in other goroutines close what the test waits on
// in defers.
func (k *contract) fatalf(format string, args ...any) {
	k.t.Helper()
	k.t.Errorf(format, args...)
	runtime.Goexit()
}

// call is one request: an operation, its path parameters, query and body.
type call struct {
	op     string
	node   string // node id; "" is the first
	params map[string]string
	query  url.Values
	body   any
	raw    []byte // a body sent as is (a bad request); skips request validation
	ctype  string // Content-Type of raw
	noAuth bool
	// invalid: the query is one the document rules out (to see it
	// refused), so the request is not validated.
	invalid bool
	// want is the status the call must get.
	want int
}

type answer struct {
	status int
	header http.Header
	body   []byte
	json   map[string]any
}

func (k *contract) url(node string) string {
	if node == "" {
		node = k.c.IDs()[0]
	}
	return k.c.URL(node)
}

// do sends one request, validates it and its answer against the document,
// and records the answer's fields.
func (k *contract) do(cl call) answer {
	k.t.Helper()
	route := k.find(cl.op)
	path := route.Path
	for name, v := range cl.params {
		path = strings.ReplaceAll(path, "{"+name+"}", v)
	}
	u := k.url(cl.node) + path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	var body []byte
	validateReq := !cl.invalid
	switch {
	case cl.raw != nil:
		body, validateReq = cl.raw, false
	case cl.body != nil:
		var err error
		if body, err = json.Marshal(cl.body); err != nil {
			k.fatalf("%v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, route.Method, u, bytes.NewReader(body))
	if err != nil {
		k.fatalf("%v", err)
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	} else {
		ct := "application/json"
		if cl.ctype != "" {
			ct = cl.ctype
		}
		req.Header.Set("Content-Type", ct)
	}
	if k.token != "" && !cl.noAuth {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: cl.params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}}
	if validateReq {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			k.t.Errorf("%s %s: the request does not match the document: %v", route.Method, u, err)
		}
		// ValidateRequest read the body: send it again.
		req.Body = io.NopCloser(bytes.NewReader(body))
		if body == nil {
			req.Body = http.NoBody
		}
	}
	res, err := k.hc.Do(req)
	if err != nil {
		k.fatalf("%s %s: %v", route.Method, u, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		k.fatalf("%s %s: read the answer: %v", route.Method, u, err)
	}
	a := answer{status: res.StatusCode, header: res.Header, body: data}
	if cl.want != 0 && res.StatusCode != cl.want {
		k.fatalf("%s %s: status %d, want %d: %s", route.Method, u, res.StatusCode, cl.want, data)
	}
	k.validateAnswer(in, route, res.StatusCode, res.Header, data)
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && route.Operation.OperationID != "getOpenAPI" {
		if err := json.Unmarshal(data, &a.json); err != nil {
			k.fatalf("%s %s: answer is not a JSON object: %v: %s", route.Method, u, err, data)
		}
		k.record(cl.op, k.answerSchema(route, res.StatusCode), a.json)
	} else {
		k.record(cl.op, nil, nil)
	}
	return a
}

func (k *contract) validateAnswer(in *openapi3filter.RequestValidationInput, route *routers.Route, status int, h http.Header, data []byte) {
	k.t.Helper()
	ct := h.Get("Content-Type")
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	// Only JSON answers have a decoder; the others are checked here.
	if !strings.HasPrefix(ct, "application/json") {
		opts.ExcludeResponseBody = true
		resp := route.Operation.Responses.Status(status)
		if resp == nil {
			resp = route.Operation.Responses.Default()
		}
		if resp == nil || resp.Value.Content.Get(strings.TrimSpace(strings.Split(ct, ";")[0])) == nil {
			k.t.Errorf("%s %s: status %d with Content-Type %q is not in the document", route.Method, route.Path, status, ct)
		}
	}
	err := openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: status, Header: h, Body: io.NopCloser(bytes.NewReader(data)), Options: opts})
	if err != nil {
		k.t.Errorf("%s %s: answer %d does not match the document: %v\nbody: %s", route.Method, route.Path, status, err, data)
	}
}

// answerSchema is the JSON schema the document gives an answer.
func (k *contract) answerSchema(route *routers.Route, status int) *openapi3.SchemaRef {
	r := route.Operation.Responses.Status(status)
	if r == nil {
		r = route.Operation.Responses.Default()
	}
	if r == nil || route.Operation.OperationID == "getOpenAPI" {
		return nil
	}
	mt := r.Value.Content.Get("application/json")
	if mt == nil {
		return nil
	}
	return mt.Schema
}

// record notes that opID was driven, and walks an answer alongside its
// schema, noting which declared fields of each schema it had.
func (k *contract) record(opID string, schema *openapi3.SchemaRef, v any) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ops[opID] = true
	if schema != nil {
		k.walk("answer of "+opID, schema, v, 0)
	}
}

func schemaName(ref *openapi3.SchemaRef, where string) string {
	if name, ok := strings.CutPrefix(ref.Ref, "#/components/schemas/"); ok {
		return name
	}
	return where
}

func (k *contract) walk(where string, ref *openapi3.SchemaRef, v any, depth int) {
	if ref == nil || ref.Value == nil || depth > 12 {
		return
	}
	name, s := schemaName(ref, where), ref.Value
	switch x := v.(type) {
	case map[string]any:
		if len(s.Properties) > 0 {
			if k.seen[name] == nil {
				k.seen[name] = map[string]bool{}
			}
			k.reached[name] = s
			for key, val := range x {
				if p, ok := s.Properties[key]; ok {
					k.seen[name][key] = true
					k.walk(name+"."+key, p, val, depth+1)
				}
			}
		}
	case []any:
		if s.Items != nil {
			for _, val := range x {
				k.walk(name+"[]", s.Items, val, depth+1)
			}
		}
	}
	if v != nil {
		// Only the alternatives the value matches: a field of one
		// alternative is not "sent" by an answer of another.
		for _, alt := range slices.Concat(s.OneOf, s.AnyOf) {
			if alt.Value != nil && alt.Value.VisitJSON(v, openapi3.EnableJSONSchema2020()) == nil {
				k.walk(where, alt, v, depth+1)
			}
		}
		for _, alt := range s.AllOf {
			k.walk(where, alt, v, depth+1)
		}
	}
}

// errCode is the error code of an error answer ("" if it has none).
func errCode(a answer) string {
	e, _ := a.json["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

// num is a JSON number of an answer as an integer (-1 if absent).
func num(m map[string]any, key string) int64 {
	f, ok := m[key].(float64)
	if !ok {
		return -1
	}
	return int64(f)
}

// sse reads an event stream until stop says enough (or the bound passes),
// validating every record's data against the schema the document names for
// its event (x-dlock-sse-events).
type sseRecord struct {
	id, event string
	data      map[string]any
}

func (k *contract) stream(cl call, ready chan struct{}, stop func(sseRecord) bool) {
	k.t.Helper()
	defer func() {
		select {
		case <-ready:
		default:
			close(ready) // the test waits on it even when the stream failed
		}
	}()
	route := k.find(cl.op)
	path := route.Path
	for name, v := range cl.params {
		path = strings.ReplaceAll(path, "{"+name+"}", v)
	}
	u := k.url(cl.node) + path + "?" + cl.query.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	req.Header.Set("Authorization", "Bearer "+k.token)
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: cl.params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		k.t.Errorf("%s: the request does not match the document: %v", u, err)
	}
	res, err := k.hc.Do(req)
	if err != nil {
		k.fatalf("%s: %v", u, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		k.fatalf("%s: %d %s", u, res.StatusCode, b)
	}
	k.validateAnswer(in, route, res.StatusCode, res.Header, nil)
	mt := route.Operation.Responses.Status(200).Value.Content.Get("text/event-stream")
	events, _ := mt.Extensions["x-dlock-sse-events"].(map[string]any)
	if len(events) == 0 {
		k.fatalf("%s: the document names no x-dlock-sse-events", route.Path)
	}
	close(ready)
	sc := bufio.NewScanner(res.Body)
	var rec sseRecord
	var data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if rec.event == "" {
				continue
			}
			ref, ok := events[rec.event]
			if !ok {
				ref = events["*"]
			}
			schema := k.sseSchema(ref)
			var v any
			if err := json.Unmarshal([]byte(data), &v); err != nil {
				k.fatalf("%s: event %s: data is not JSON: %v", u, rec.event, err)
			}
			if err := schema.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.MultiErrors()); err != nil {
				k.t.Errorf("%s: event %q does not match the document: %v\ndata: %s", u, rec.event, err, data)
			}
			rec.data, _ = v.(map[string]any)
			k.record(cl.op, k.sseSchemaRef(ref), v)
			if stop(rec) {
				return
			}
			rec, data = sseRecord{}, ""
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			rec.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			rec.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data += line[6:]
		}
	}
	k.fatalf("%s: the stream ended before the test saw what it waited for: %v", u, sc.Err())
}

func (k *contract) sseSchema(ref any) *openapi3.Schema { return k.sseSchemaRef(ref).Value }

// sseSchemaRef resolves an x-dlock-sse-events entry ({"$ref": ...}).
func (k *contract) sseSchemaRef(ref any) *openapi3.SchemaRef {
	k.t.Helper()
	m, _ := ref.(map[string]any)
	r, _ := m["$ref"].(string)
	name := strings.TrimPrefix(r, "#/components/schemas/")
	s := k.doc.Components.Schemas[name]
	if s == nil {
		k.fatalf("x-dlock-sse-events names %q, which is not a schema", r)
	}
	return &openapi3.SchemaRef{Ref: r, Value: s.Value}
}

func loadDoc(t *testing.T, data []byte) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("load the document: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("the document is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	return doc
}

// TestDocumentIsValid loads the embedded document, so a broken document
// fails fast and without a cluster.
func TestDocumentIsValid(t *testing.T) {
	data, err := apidoc.JSON()
	if err != nil {
		t.Fatal(err)
	}
	loadDoc(t, data)
}

// TestContract drives every operation of the document against a real
// 3-node cluster with ACLs on, validating every request and answer.
func TestContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	c := testcluster.NewWith(t, 3, testcluster.Options{ACL: true,
		// Short, so that an old from_revision is compacted (410) after the
		// few dozen events the test makes; the live watch reads as they come.
		WatchHistory: 40})
	k := &contract{t: t, c: c, hc: c.Client, seen: map[string]map[string]bool{}, reached: map[string]*openapi3.Schema{}, ops: map[string]bool{}}

	// The document the node serves is the embedded one, and valid.
	res, err := c.Client.Get(c.URL(c.IDs()[1]) + "/api/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(res.Body)
	res.Body.Close()
	want, _ := apidoc.JSON()
	if res.StatusCode != 200 || !bytes.Equal(served, want) {
		t.Fatalf("GET /api/v1/openapi.json: %d, %d bytes; want the embedded document (%d bytes)", res.StatusCode, len(served), len(want))
	}
	k.doc = loadDoc(t, served)
	k.do(call{op: "getOpenAPI", want: 200})
	k.do(call{op: "healthz", want: 200})
	k.do(call{op: "readyz", want: 200})
	k.do(call{op: "metrics", want: 200})

	// ACL: without a token, 401; bootstrap gives the management token.
	k.do(call{op: "getCluster", want: 401})
	boot := k.do(call{op: "aclBootstrap", want: 200})
	k.token = boot.json["secret_id"].(string)
	k.do(call{op: "aclBootstrap", want: 403})
	tok := k.do(call{op: "createACLToken", want: 200, body: map[string]any{
		"description": "contract test", "rules": []map[string]any{{"prefix": "ro/", "permissions": []string{"read"}}},
		"client_ids": []string{"ro-*"}, "ttl_ms": 3_600_000, "cert_cns": []string{"contract-cn"}}})
	k.do(call{op: "listACLTokens", want: 200})
	// A token that may revoke grants under ops/ (and nothing else).
	opsTok := k.do(call{op: "createACLToken", want: 200, body: map[string]any{
		"description": "operators", "rules": []map[string]any{{"prefix": "ops/", "permissions": []string{"read", "revoke"}}}}})
	ops := opsTok.json["secret_id"].(string)
	ro := tok.json["secret_id"].(string)
	k.token, ro = ro, k.token
	k.do(call{op: "acquireLock", params: map[string]string{"name": "elsewhere"}, want: 403, body: map[string]any{"client_id": "ro-1", "ttl_ms": 5000}})
	// Reading a name is not revoking its grants.
	k.do(call{op: "revokeLock", params: map[string]string{"name": "ro/x"}, want: 403, body: map[string]any{"reason": "no permission"}})
	k.do(call{op: "revokeElection", params: map[string]string{"name": "ro/x"}, want: 403, body: map[string]any{"reason": "no permission"}})
	k.token = ro
	k.do(call{op: "deleteACLToken", params: map[string]string{"accessor_id": tok.json["accessor_id"].(string)}, want: 200})
	k.do(call{op: "deleteACLToken", params: map[string]string{"accessor_id": tok.json["accessor_id"].(string)}, want: 404})

	// Cluster.
	leader := c.WaitLeader(20 * time.Second)
	k.do(call{op: "getCluster", want: 200})
	k.do(call{op: "getCluster", query: url.Values{"health": {"true"}}, want: 200})
	k.do(call{op: "getCluster", query: url.Values{"bogus": {"1"}}, want: 400})
	k.do(call{op: "getTokenKeys", want: 200})
	k.do(call{op: "getSnapshot", want: 200})
	// Adding a member that exists with the same details changes nothing.
	k.do(call{op: "addMember", body: map[string]any{"id": "n3", "raft_addr": c.RaftAddr("n3")}, want: 200})
	var target string
	for _, id := range c.IDs() {
		if id != leader {
			target = id
		}
	}
	k.do(call{op: "transferLeadership", body: map[string]any{"id": target}, want: 200})
	// One group has no ranges: a split is refused, and changes nothing.
	k.do(call{op: "splitShard", body: map[string]any{"at": "m"}, want: 400})
	k.do(call{op: "moveShard", body: map[string]any{"shard": 0, "from": "n1", "to": "n2"}, want: 400})
	c.WaitLeader(20 * time.Second)

	// Watch everything from here on while the rest runs; it must see every
	// kind of event the document lists.
	watchReady := make(chan struct{})
	watchDone := make(chan struct{})
	wantTypes := map[string]bool{"acquired": true, "released": true, "expired": true, "queued": true, "dequeued": true,
		"elected": true, "resigned": true, "proclaimed": true, "session_created": true, "session_deleted": true,
		"revoked": true, "value_changed": true, "delay_ended": true}
	go func() {
		defer close(watchDone)
		got := map[string]bool{}
		k.stream(call{op: "watch", query: url.Values{"prefix": {""}}}, watchReady, func(r sseRecord) bool {
			got[r.event] = true
			for typ := range wantTypes {
				if !got[typ] {
					return false
				}
			}
			return true
		})
	}()
	<-watchReady
	if t.Failed() {
		t.FailNow()
	}

	// Locks.
	lk := map[string]string{"name": "billing/job"}
	g := k.do(call{op: "acquireLock", params: lk, want: 200, body: map[string]any{"client_id": "w1", "ttl_ms": 30000, "request_id": "r-1"}})
	token, lease := g.json["fencing_token"], g.json["lease_id"]
	k.do(call{op: "acquireLock", params: lk, want: 409, body: map[string]any{"client_id": "w2", "ttl_ms": 30000}})
	k.do(call{op: "acquireLock", params: lk, want: 409, body: map[string]any{"client_id": "w2", "ttl_ms": 30000, "wait_timeout_ms": 200}})
	k.do(call{op: "acquireLock", params: lk, want: 400, raw: []byte(`{"client_id":"w2","ttl_ms":30000,"bogus":1}`)})
	k.do(call{op: "acquireLock", params: lk, want: 415, raw: []byte(`{"client_id":"w2","ttl_ms":30000}`), ctype: "text/plain"})
	k.do(call{op: "acquireLock", params: lk, want: 413, raw: append(append([]byte(`{"client_id":"`), bytes.Repeat([]byte("x"), 70<<10)...), `"}`...)})
	k.do(call{op: "acquireLock", params: lk, want: 404, body: map[string]any{"client_id": "w2", "session_id": strings.Repeat("ab", 16)}})
	k.do(call{op: "getLock", params: lk, want: 200})
	k.do(call{op: "getLock", params: lk, node: target, query: url.Values{"stale": {"true"}}, want: 200})
	k.do(call{op: "getLock", params: map[string]string{"name": "nobody/holds/this"}, want: 200})
	k.do(call{op: "getLock", params: map[string]string{"name": "bad..name/../x"}, want: 400})
	k.do(call{op: "listLocks", query: url.Values{"prefix": {"billing/"}, "limit": {"10"}}, want: 200})
	k.do(call{op: "renewLock", params: lk, want: 200, body: map[string]any{"client_id": "w1", "fencing_token": token, "lease_id": lease, "ttl_ms": 20000}})
	k.do(call{op: "renewLock", params: lk, want: 409, body: map[string]any{"client_id": "w1", "fencing_token": token, "lease_id": strings.Repeat("0", 32)}})
	// A waiter in line while the lock is released: queued, acquired by hand-off.
	waiterDone := make(chan answer, 1)
	go func() {
		defer close(waiterDone)
		waiterDone <- k.do(call{op: "acquireLock", params: lk, want: 200, body: map[string]any{"client_id": "w3", "ttl_ms": 30000, "wait_timeout_ms": 30000}})
	}()
	testutil.Eventually(t, 20*time.Second, "w3 waits in line", func() bool {
		var v struct{ Waiters int }
		return k.peek("GET", "/api/v1/locks/billing/job", nil, &v) && v.Waiters == 1
	})
	// The queue, in a read of the lock.
	k.do(call{op: "getLock", params: lk, want: 200})
	k.do(call{op: "releaseLock", params: lk, want: 200, body: map[string]any{"client_id": "w1", "fencing_token": token, "lease_id": lease, "request_id": "rel-1"}})
	k.do(call{op: "releaseLock", params: lk, want: 409, body: map[string]any{"client_id": "w1", "fencing_token": token, "lease_id": lease}})
	w3, ok := <-waiterDone
	if !ok {
		t.FailNow()
	}
	k.do(call{op: "releaseLock", params: lk, want: 200, body: map[string]any{"client_id": "w3", "fencing_token": w3.json["fencing_token"], "lease_id": w3.json["lease_id"]}})

	// lock_lost: a grant nobody renews ends; a retry of its request learns it.
	lost := map[string]string{"name": "lost"}
	body := map[string]any{"client_id": "w4", "ttl_ms": 1000, "request_id": "lost-1"}
	k.do(call{op: "acquireLock", params: lost, want: 200, body: body})
	testutil.Eventually(t, 20*time.Second, "the unrenewed grant expires", func() bool {
		v := struct{ Held bool }{Held: true}
		return k.peek("GET", "/api/v1/locks/lost", nil, &v) && !v.Held
	})
	k.do(call{op: "acquireLock", params: lost, want: 409, body: body})

	k.lockModel()
	k.operate(ops)

	// Sessions.
	s := k.do(call{op: "createSession", want: 201, body: map[string]any{"client_id": "s1", "ttl_ms": 10000, "request_id": "sess-1"}})
	sid := s.json["session_id"].(string)
	sp := map[string]string{"session_id": sid}
	k.do(call{op: "keepAliveSession", params: sp, want: 200})
	k.do(call{op: "keepAliveSession", params: sp, want: 200, body: map[string]any{"client_id": "s1", "request_id": "ka-1"}})
	sl := k.do(call{op: "acquireLock", params: map[string]string{"name": "sess/lock"}, want: 200, body: map[string]any{"client_id": "s1", "session_id": sid}})
	// A revoke of the session's grant: the next keepalive lists it, one
	// after its revision does not.
	k.do(call{op: "revokeLock", params: map[string]string{"name": "sess/lock"}, want: 200, body: map[string]any{"fencing_token": sl.json["fencing_token"], "reason": "contract"}})
	ka := k.do(call{op: "keepAliveSession", params: sp, want: 200, body: map[string]any{"client_id": "s1", "lost_after": 0}})
	if lost, _ := ka.json["lost"].([]any); len(lost) != 1 || lost[0].(map[string]any)["fencing_token"] != sl.json["fencing_token"] {
		t.Errorf("keepalive after a revoke of the session's grant: %s, want it in lost", ka.body)
	}
	ka = k.do(call{op: "keepAliveSession", params: sp, want: 200, body: map[string]any{"lost_after": ka.json["revision"]}})
	if lost, _ := ka.json["lost"].([]any); len(lost) != 0 {
		t.Errorf("keepalive after the revision that listed it: %s, want no lost grants", ka.body)
	}
	k.do(call{op: "deleteSession", params: sp, want: 200, body: map[string]any{"client_id": "s1"}})
	k.do(call{op: "deleteSession", params: sp, want: 404})
	k.do(call{op: "keepAliveSession", params: sp, want: 404})

	// Elections, observed while they change.
	ep := map[string]string{"name": "svc/leader"}
	k.do(call{op: "getElection", params: ep, want: 200})
	obsReady := make(chan struct{})
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		k.stream(call{op: "getElection", params: ep, query: url.Values{"observe": {"true"}}}, obsReady, func(r sseRecord) bool {
			l, _ := r.data["leader"].(map[string]any)
			return l != nil && l["value"] == "v2"
		})
	}()
	<-obsReady
	if t.Failed() {
		t.FailNow()
	}
	e1 := k.do(call{op: "campaign", params: ep, want: 200, body: map[string]any{"candidate_id": "c1", "value": "v1", "ttl_ms": 30000}})
	et, el := e1.json["fencing_token"], e1.json["lease_id"]
	k.do(call{op: "campaign", params: ep, want: 409, body: map[string]any{"candidate_id": "c2", "value": "x", "ttl_ms": 30000}})
	k.do(call{op: "getElection", params: ep, want: 200})
	k.do(call{op: "getElection", params: ep, node: target, query: url.Values{"stale": {"true"}}, want: 200})
	k.do(call{op: "listElections", query: url.Values{"prefix": {"svc/"}, "limit": {"10"}}, want: 200})
	k.do(call{op: "listElections", node: target, query: url.Values{"stale": {"true"}}, want: 200})
	k.do(call{op: "proclaim", params: ep, want: 200, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": el, "value": "v2"}})
	k.do(call{op: "proclaim", params: ep, want: 409, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": strings.Repeat("0", 32), "value": "v3"}})
	k.do(call{op: "renewElection", params: ep, want: 200, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": el, "ttl_ms": 20000}})
	k.do(call{op: "renewElection", params: ep, want: 409, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": strings.Repeat("0", 32)}})
	<-obsDone
	k.do(call{op: "resign", params: ep, want: 200, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": el, "request_id": "res-1"}})
	k.do(call{op: "resign", params: ep, want: 409, body: map[string]any{"candidate_id": "c1", "fencing_token": et, "lease_id": el}})
	elost := map[string]string{"name": "svc/lost"}
	ebody := map[string]any{"candidate_id": "c5", "value": "x", "ttl_ms": 1000, "request_id": "elost-1"}
	k.do(call{op: "campaign", params: elost, want: 200, body: ebody})
	testutil.Eventually(t, 20*time.Second, "the unrenewed seat expires", func() bool {
		v := struct{ Leader any }{Leader: 1}
		return k.peek("GET", "/api/v1/elections/svc/lost", nil, &v) && v.Leader == nil
	})
	k.do(call{op: "campaign", params: elost, want: 409, body: ebody})
	k.electionOps()

	<-watchDone
	k.do(call{op: "watch", query: url.Values{"from_revision": {"99999999"}}, want: 400})

	// Key rotation: the retired key is listed with its bound.
	k.do(call{op: "rotateTokenKey", want: 200})
	k.do(call{op: "rotateTokenKey", want: 200, body: map[string]any{"revoke_retired": false}})

	// Checkpoints come every 256 log entries: renew until one is shown.
	g = k.do(call{op: "acquireLock", params: map[string]string{"name": "busy"}, want: 200, body: map[string]any{"client_id": "b1", "ttl_ms": 60000}})
	testutil.Eventually(t, 60*time.Second, "a checkpoint", func() bool {
		for range 20 {
			k.peek("POST", "/api/v1/locks/busy/renew", map[string]any{"client_id": "b1", "fencing_token": g.json["fencing_token"], "lease_id": g.json["lease_id"]}, nil)
		}
		a := k.do(call{op: "getCluster", want: 200})
		_, ok := a.json["checkpoint_index"]
		return ok
	})

	// Push the first revisions out of the watch history: 410 compacted.
	for i := range 30 {
		var gr struct {
			FencingToken uint64 `json:"fencing_token"`
			LeaseID      string `json:"lease_id"`
		}
		if !k.peek("POST", "/api/v1/locks/churn/acquire", map[string]any{"client_id": "ch", "ttl_ms": 5000}, &gr) ||
			!k.peek("POST", "/api/v1/locks/churn/release", map[string]any{"client_id": "ch", "fencing_token": gr.FencingToken, "lease_id": gr.LeaseID}, nil) {
			t.Fatalf("churn %d failed", i)
		}
	}
	k.do(call{op: "watch", query: url.Values{"from_revision": {"1"}}, want: 410})

	// The WebSocket upgrade answers 101.
	k.wsUpgrade()

	// Last, as it shrinks the cluster: remove a follower.
	leader = c.WaitLeader(20 * time.Second)
	for _, id := range c.IDs() {
		if id != leader {
			target = id
		}
	}
	k.do(call{op: "removeMember", node: leader, params: map[string]string{"member_id": target}, want: 200})
	k.do(call{op: "removeMember", node: leader, params: map[string]string{"member_id": target}, want: 404})

	k.sharded()
	k.checkCoverage()
}

// sharded drives the answers only a sharded cluster gives (per-shard
// revisions, the shard list, merged watch events) on a one-node, 4-shard
// cluster without ACLs.
func (k *contract) sharded() {
	t := k.t
	m, err := shard.NewMap(shard.DefaultBounds(4))
	if err != nil {
		t.Fatal(err)
	}
	k.c = testcluster.NewWith(t, 1, testcluster.Options{Shards: &m})
	k.hc, k.token = k.c.Client, ""
	k.c.WaitLeader(20 * time.Second)
	testutil.Eventually(t, 20*time.Second, "every shard ready", func() bool { return k.peek("GET", "/readyz", nil, nil) })
	ready := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.stream(call{op: "watch", query: url.Values{"prefix": {""}}}, ready, func(r sseRecord) bool { return r.event == "acquired" })
	}()
	<-ready
	if !k.peek("POST", "/api/v1/locks/tango/x/acquire", map[string]any{"client_id": "sh", "ttl_ms": 5000}, nil) {
		t.Fatal("acquire on the sharded cluster failed")
	}
	<-done
	k.do(call{op: "getCluster", want: 200})
	k.do(call{op: "listLocks", want: 200})
	k.do(call{op: "listElections", want: 200})
	k.do(call{op: "moveShard", body: map[string]any{"shard": 1, "from": "n1", "to": "n9"}, want: 400})
}

// peek sends a request outside the contract's records (a wait for a
// condition) and reports whether it was answered 200.
func (k *contract) peek(method, path string, body, out any) bool {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, k.url("")+path, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+k.token)
	res, err := k.hc.Do(req)
	if err != nil {
		return false
	}
	defer res.Body.Close()
	if out != nil && json.NewDecoder(res.Body).Decode(out) != nil {
		return false
	}
	return res.StatusCode == http.StatusOK
}

// wsUpgrade checks the upgrade's status against the document.
func (k *contract) wsUpgrade() {
	route := k.find("webSocket")
	req, _ := http.NewRequest(http.MethodGet, k.url("")+route.Path, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	req.Header.Set("Authorization", "Bearer "+k.token)
	res, err := k.hc.Do(req)
	if err != nil {
		k.fatalf("%v", err)
	}
	res.Body.Close()
	if route.Operation.Responses.Status(res.StatusCode) == nil || res.StatusCode != http.StatusSwitchingProtocols {
		k.t.Errorf("GET %s: status %d, want the documented 101", route.Path, res.StatusCode)
	}
	k.record("webSocket", nil, nil)
}

// checkCoverage fails for an operation never driven, and for a field that
// a schema of the answers declares but no answer ever had.
func (k *contract) checkCoverage() {
	k.t.Helper()
	var missing []string
	for _, item := range k.doc.Paths.Map() {
		for _, o := range item.Operations() {
			if !k.ops[o.OperationID] {
				missing = append(missing, "operation "+o.OperationID+" was never driven")
			}
		}
	}
	for name, s := range k.reached {
		for field := range s.Properties {
			if !k.seen[name][field] && notAlwaysSent[name+"."+field] == "" {
				missing = append(missing, fmt.Sprintf("schema %s declares %q, which no answer ever had", name, field))
			}
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		k.t.Error(m)
	}
}

// TestErrorCodes: the document lists exactly the codes of the one table
// (internal/apierror), each with its HTTP status.
func TestErrorCodes(t *testing.T) {
	data, _ := apidoc.JSON()
	doc := loadDoc(t, data)
	s := doc.Components.Schemas["ErrorCode"].Value
	var listed []string
	for _, v := range s.Enum {
		listed = append(listed, v.(string))
	}
	slices.Sort(listed)
	var codes []string
	for _, c := range apierror.Codes() {
		codes = append(codes, string(c))
		if want := fmt.Sprintf("%s %d", c, apierror.HTTPStatus(c)); !strings.Contains(strings.Join(strings.Fields(s.Description), " "), want) {
			t.Errorf("ErrorCode's description does not say %q", want)
		}
	}
	if !slices.Equal(listed, codes) {
		t.Errorf("ErrorCode lists %v; the table has %v", listed, codes)
	}
}

// lockModel drives counting, shared and subtree locks: each refusal the
// document names (limit_mismatch with the lock's limit, lock_held through a
// subtree with holder.lock) and the views that list every holder.
func (k *contract) lockModel() {
	t := k.t
	t.Helper()
	dp := map[string]string{"name": "deploys"}
	k.do(call{op: "acquireLock", params: dp, want: 200, body: map[string]any{"client_id": "d1", "ttl_ms": 30000, "limit": 3}})
	k.do(call{op: "acquireLock", params: dp, want: 200, body: map[string]any{"client_id": "d2", "ttl_ms": 30000, "limit": 3}})
	mm := k.do(call{op: "acquireLock", params: dp, want: 409, body: map[string]any{"client_id": "d3", "ttl_ms": 30000, "limit": 2}})
	if errCode(mm) != "limit_mismatch" || num(mm.json, "limit") != 3 {
		t.Errorf("an acquire with limit 2 of a lock of limit 3: %s, want limit_mismatch with limit 3", mm.body)
	}
	// A plain acquire of a counting lock is a mismatch too.
	k.do(call{op: "acquireLock", params: dp, want: 409, body: map[string]any{"client_id": "d3", "ttl_ms": 30000}})
	k.do(call{op: "acquireLock", params: dp, want: 400, body: map[string]any{"client_id": "d3", "ttl_ms": 30000, "limit": 3, "mode": "shared"}})
	v := k.do(call{op: "getLock", params: dp, want: 200})
	if hs, _ := v.json["holders"].([]any); len(hs) != 2 || num(v.json, "limit") != 3 {
		t.Errorf("GET deploys: %s, want limit 3 and two holders", v.body)
	}
	k.do(call{op: "listLocks", query: url.Values{"prefix": {"deploys"}}, want: 200})
	// Revoke with no token: every holder at once.
	rv := k.do(call{op: "revokeLock", params: dp, want: 200, body: map[string]any{"reason": "contract: every holder", "client_id": "admin-1", "request_id": "rv-all"}})
	if ts, _ := rv.json["fencing_tokens"].([]any); len(ts) != 2 {
		t.Errorf("revoke of every holder of deploys: %s, want two fencing_tokens", rv.body)
	}
	k.do(call{op: "revokeLock", params: dp, want: 404, body: map[string]any{"reason": "nobody holds it"}})
	k.do(call{op: "revokeLock", params: dp, want: 400, raw: []byte(`{"reason":""}`)})

	// Shared holders coexist; an exclusive request waits for them.
	cp := map[string]string{"name": "config"}
	k.do(call{op: "acquireLock", params: cp, want: 200, body: map[string]any{"client_id": "r1", "ttl_ms": 30000, "mode": "shared"}})
	k.do(call{op: "acquireLock", params: cp, want: 200, body: map[string]any{"client_id": "r2", "ttl_ms": 30000, "mode": "shared"}})
	k.do(call{op: "acquireLock", params: cp, want: 409, body: map[string]any{"client_id": "w", "ttl_ms": 30000, "mode": "exclusive"}})
	v = k.do(call{op: "getLock", params: cp, want: 200})
	if hs, _ := v.json["holders"].([]any); len(hs) != 2 || v.json["mode"] != "shared" {
		t.Errorf("GET config: %s, want two shared holders", v.body)
	}

	// A subtree grant keeps out a name below it, and the refusal says where.
	k.do(call{op: "acquireLock", params: map[string]string{"name": "tree"}, want: 200, body: map[string]any{"client_id": "t1", "ttl_ms": 30000, "subtree": true}})
	c := k.do(call{op: "acquireLock", params: map[string]string{"name": "tree/leaf"}, want: 409, body: map[string]any{"client_id": "t2", "ttl_ms": 30000}})
	if h, _ := c.json["holder"].(map[string]any); errCode(c) != "lock_held" || h["lock"] != "tree" || h["subtree"] != true {
		t.Errorf("acquire of tree/leaf under a subtree grant on tree: %s, want lock_held by a subtree holder of lock tree", c.body)
	}
	v = k.do(call{op: "getLock", params: map[string]string{"name": "tree"}, want: 200})
	if v.json["subtree"] != true {
		t.Errorf("GET tree: %s, want subtree true", v.body)
	}
}

// operate drives a holder's value, a revoke by a token with the revoke
// permission (opsToken), the revoked holder's lock_lost, the lock-delay the
// revoke began (delayed_until, lock_delayed with retry_after_ms and
// Retry-After) and the grant history that records it all.
func (k *contract) operate(opsToken string) {
	t := k.t
	t.Helper()
	op := map[string]string{"name": "ops/db"}
	g := k.do(call{op: "acquireLock", params: op, want: 200, body: map[string]any{"client_id": "op-1", "ttl_ms": 30000,
		"value": "pid 1 on host-a", "lock_delay_ms": 60000}})
	holder := map[string]any{"client_id": "op-1", "fencing_token": g.json["fencing_token"], "lease_id": g.json["lease_id"]}
	k.do(call{op: "renewLock", params: op, want: 200, body: map[string]any{"client_id": "op-1", "fencing_token": g.json["fencing_token"],
		"lease_id": g.json["lease_id"], "value": "pid 1 on host-b"}})
	v := k.do(call{op: "getLock", params: op, want: 200})
	if v.json["value"] != "pid 1 on host-b" {
		t.Errorf("GET ops/db after a renew with a value: %s, want the new value", v.body)
	}
	k.do(call{op: "acquireLock", params: op, want: 400, body: map[string]any{"client_id": "op-2", "ttl_ms": 30000, "lock_delay_ms": 60000, "limit": 2}})

	mgmt := k.token
	k.token = opsToken
	rv := k.do(call{op: "revokeLock", params: op, want: 200, body: map[string]any{"fencing_token": g.json["fencing_token"], "reason": "stuck",
		"client_id": "ops-admin", "request_id": "rv-1"}})
	k.token = mgmt
	if rv.json["fencing_token"] != g.json["fencing_token"] {
		t.Errorf("revoke of token %v: %s", g.json["fencing_token"], rv.body)
	}
	k.do(call{op: "revokeLock", params: op, want: 404, body: map[string]any{"fencing_token": g.json["fencing_token"], "reason": "again"}})
	lost := k.do(call{op: "renewLock", params: op, want: 409, body: holder})
	if errCode(lost) != "lock_lost" || lost.json["fencing_token"] != g.json["fencing_token"] {
		t.Errorf("renew of a revoked grant: %s, want lock_lost with its token", lost.body)
	}
	v = k.do(call{op: "getLock", params: op, want: 200})
	if _, ok := v.json["delayed_until"]; !ok {
		t.Errorf("GET ops/db in its lock-delay: %s, want delayed_until", v.body)
	}
	d := k.do(call{op: "acquireLock", params: op, want: 409, body: map[string]any{"client_id": "op-2", "ttl_ms": 30000}})
	e, _ := d.json["error"].(map[string]any)
	if errCode(d) != "lock_delayed" || num(e, "retry_after_ms") <= 0 || d.header.Get("Retry-After") == "" {
		t.Errorf("acquire in a lock-delay: %s (Retry-After %q), want lock_delayed with retry_after_ms and Retry-After", d.body, d.header.Get("Retry-After"))
	}

	// A short lock-delay runs out: the watch sees delay_ended, then the
	// waiter's hand-off.
	sp := map[string]string{"name": "ops/short"}
	sg := k.do(call{op: "acquireLock", params: sp, want: 200, body: map[string]any{"client_id": "op-3", "ttl_ms": 30000, "lock_delay_ms": 500}})
	k.do(call{op: "revokeLock", params: sp, want: 200, body: map[string]any{"fencing_token": sg.json["fencing_token"], "reason": "short delay"}})
	next := k.do(call{op: "acquireLock", params: sp, want: 200, body: map[string]any{"client_id": "op-4", "ttl_ms": 30000, "wait_timeout_ms": 20000}})
	k.do(call{op: "releaseLock", params: sp, want: 200, body: map[string]any{"client_id": "op-4", "fencing_token": next.json["fencing_token"], "lease_id": next.json["lease_id"]}})

	h := k.do(call{op: "getHistory", params: op, want: 200})
	gs, _ := h.json["grants"].([]any)
	if len(gs) != 1 {
		t.Fatalf("history of ops/db: %s, want its one grant", h.body)
	}
	g0, _ := gs[0].(map[string]any)
	if g0["end_cause"] != "revoked" || g0["reason"] != "stuck" || g0["value"] != "pid 1 on host-b" || num(g0, "lock_delay_ms") != 60000 {
		t.Errorf("history of ops/db: %s, want the revoked grant with its reason, value and lock-delay", h.body)
	}
	k.do(call{op: "getHistory", params: map[string]string{"name": "billing/job"}, query: url.Values{"limit": {"1"}, "kind": {"lock"}}, want: 200})
	k.do(call{op: "getHistory", params: op, node: k.c.IDs()[2], query: url.Values{"stale": {"true"}}, want: 200})
	k.do(call{op: "getHistory", params: op, query: url.Values{"kind": {"bogus"}}, invalid: true, want: 400})
	k.do(call{op: "getHistory", params: op, query: url.Values{"limit": {"99999"}}, invalid: true, want: 400})
}

// electionOps drives an election's revoke (with a token and without) and
// its history.
func (k *contract) electionOps() {
	t := k.t
	t.Helper()
	rp := map[string]string{"name": "svc/rev"}
	e := k.do(call{op: "campaign", params: rp, want: 200, body: map[string]any{"candidate_id": "c7", "value": "v7", "ttl_ms": 30000}})
	k.do(call{op: "revokeElection", params: rp, want: 200, body: map[string]any{"fencing_token": e.json["fencing_token"], "reason": "stuck leader"}})
	lost := k.do(call{op: "renewElection", params: rp, want: 409, body: map[string]any{"candidate_id": "c7", "fencing_token": e.json["fencing_token"], "lease_id": e.json["lease_id"]}})
	if errCode(lost) != "lock_lost" {
		t.Errorf("renew of a revoked leader: %s, want lock_lost", lost.body)
	}
	k.do(call{op: "campaign", params: rp, want: 200, body: map[string]any{"candidate_id": "c8", "value": "v8", "ttl_ms": 30000}})
	rv := k.do(call{op: "revokeElection", params: rp, want: 200, body: map[string]any{"reason": "every leader", "request_id": "rve-1", "client_id": "admin-1"}})
	if ts, _ := rv.json["fencing_tokens"].([]any); len(ts) != 1 {
		t.Errorf("revoke of svc/rev's leader: %s, want one fencing token", rv.body)
	}
	k.do(call{op: "revokeElection", params: rp, want: 404, body: map[string]any{"reason": "nobody leads"}})
	h := k.do(call{op: "getHistory", params: rp, query: url.Values{"kind": {"election"}}, want: 200})
	if gs, _ := h.json["grants"].([]any); len(gs) != 2 {
		t.Errorf("history of election svc/rev: %s, want its two revoked grants", h.body)
	}
	h = k.do(call{op: "getHistory", params: map[string]string{"name": "svc/leader"}, query: url.Values{"kind": {"election"}}, want: 200})
	if gs, _ := h.json["grants"].([]any); len(gs) == 0 || gs[0].(map[string]any)["end_cause"] != "resigned" {
		t.Errorf("history of election svc/leader: %s, want the resigned grant first", h.body)
	}
}
