package chaos

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// TestRecheckHistory re-runs the history checkers on a saved history.jsonl
// (DLOCK_CHAOS_RECHECK=path), e.g. after improving a checker, without
// re-running the faults. A sharded run's history needs DLOCK_CHAOS_SHARDS
// (its tokens are compared per shard).
func TestRecheckHistory(t *testing.T) {
	path := os.Getenv("DLOCK_CHAOS_RECHECK")
	if path == "" {
		t.Skip("set DLOCK_CHAOS_RECHECK to a history.jsonl to re-check it")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ops []Op
	var ws []write
	var hs []hold
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var rec struct {
			Op    *Op    `json:"op"`
			Write *write `json:"write"`
			Hold  *hold  `json:"hold"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		switch {
		case rec.Op != nil:
			ops = append(ops, *rec.Op)
		case rec.Write != nil:
			ws = append(ws, *rec.Write)
		case rec.Hold != nil:
			hs = append(hs, *rec.Hold)
		}
	}
	var all []anomaly
	all = append(all, checkHolds(ops, hs)...)
	all = append(all, checkTokens(ops, defaultShardMap(envInt("DLOCK_CHAOS_SHARDS", 1)))...)
	fa, _ := checkFence(ops, ws)
	all = append(all, fa...)
	all = append(all, checkSessions(ops)...)
	all = append(all, checkConflictHolders(ops)...)
	for _, l := range checkLinearizable(ops, 60*time.Second, "") {
		if l.result != "Ok" {
			all = append(all, anomaly{Kind: "linearizability", What: l.lock + ": " + string(l.result), Detail: l.detail})
		}
	}
	t.Logf("%d operations, %d writes, %d holds: %d anomalies", len(ops), len(ws), len(hs), len(all))
	for _, a := range all {
		t.Errorf("%s", a.String())
	}
}
