package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock/dlock/client"
)

// TestPrintMembersRemoving: a member the shard map lists as being removed
// is marked in the state column of `dlock members`; the others are not.
func TestPrintMembersRemoving(t *testing.T) {
	const answer = `{"node_id":"n1","leader_id":"n1","term":3,"members":[
		{"id":"n1","raft_addr":"127.0.0.1:1","api_addr":"127.0.0.1:2","suffrage":"voter","state":"leader"},
		{"id":"n4","raft_addr":"127.0.0.1:3","api_addr":"127.0.0.1:4","suffrage":"voter","state":"follower","removing":true}],
		"commit_index":9,"applied_index":9,"revision":1,"last_fencing_token":0,
		"shards":[{"id":0,"start":"","end":"","leader_id":"n1","term":3,"commit_index":9,"applied_index":9,"revision":1,"last_fencing_token":0,"replicas":["n1"]}],
		"shard_generation":4}`
	var ci client.ClusterInfo
	if err := json.Unmarshal([]byte(answer), &ci); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printMembers(&out, &ci); err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			rows[f[0]] = line
		}
	}
	if r := rows["n4"]; !strings.Contains(r, "follower (removing)") {
		t.Fatalf("n4's row %q does not show its removal:\n%s", r, out.String())
	}
	if r := rows["n1"]; r == "" || strings.Contains(r, "removing") {
		t.Fatalf("n1's row %q:\n%s", r, out.String())
	}
	if !strings.Contains(out.String(), "shard map generation 4") {
		t.Fatalf("no shards table:\n%s", out.String())
	}
}
