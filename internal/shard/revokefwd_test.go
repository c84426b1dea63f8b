package shard_test

import (
	"testing"

	"github.com/dlock/dlock/internal/testcluster"
)

// A revoke sent to a node that does not run the name's shard is forwarded
// to a replica with its name (the request's JSON form leaves the name out,
// as the path carries it): the grant is revoked and the next one fenced.
func TestRevokeThroughANodeWithoutTheShard(t *testing.T) {
	c, m, away := placed4(t, testcluster.Options{})
	name := shardName(t, m, away) + "/revoked"
	type grant struct {
		Acquired     bool   `json:"acquired"`
		FencingToken uint64 `json:"fencing_token"`
	}
	var a, b grant
	if code := post(t, c, c.URL("n1")+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "a", "ttl_ms": 60000, "request_id": "rv-a"}, &a); code != 200 || !a.Acquired {
		t.Fatalf("acquire %s through n1: %d %+v", name, code, a)
	}
	var out map[string]any
	if code := post(t, c, c.URL("n1")+"/api/v1/locks/"+name+"/revoke", map[string]any{"fencing_token": a.FencingToken, "reason": "test", "request_id": "rv-r"}, &out); code != 200 {
		t.Fatalf("revoke %s through n1, which does not run shard %d: %d %v", name, m.IDs[away], code, out)
	}
	if code := post(t, c, c.URL("n1")+"/api/v1/locks/"+name+"/acquire", map[string]any{"client_id": "b", "ttl_ms": 60000, "request_id": "rv-b"}, &b); code != 200 || !b.Acquired || b.FencingToken <= a.FencingToken {
		t.Fatalf("acquire after the revoke of token %d: %d %+v", a.FencingToken, code, b)
	}
}
