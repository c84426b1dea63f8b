package main

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock/dlock/client"
)

// runMembersChange runs dlock members add, remove and transfer-leadership.
func runMembersChange(sub string, args []string) error {
	fs := newCmdFlags("members "+sub, membersUsage)
	var g globalFlags
	g.register(fs)
	want := map[string][2]int{"add": {2, 2}, "remove": {1, 1}, "transfer-leadership": {0, 1}}[sub]
	pos, rest, err := parseCmd(fs, &g, args, want[1])
	if err != nil {
		return err
	}
	if len(rest) != 0 || len(pos) < want[0] {
		return usageErrorf("want: dlock members %s", map[string]string{
			"add": "add ID RAFT_ADDR", "remove": "remove ID", "transfer-leadership": "transfer-leadership [ID]"}[sub])
	}
	c, ctx, done, err := g.connect(0)
	if err != nil {
		return err
	}
	defer done()
	var ci *client.ClusterInfo
	var msg string
	switch sub {
	case "add":
		ci, err = c.AddMember(ctx, pos[0], pos[1])
		msg = fmt.Sprintf("added %s (%s); it is promoted to voter once caught up", pos[0], pos[1])
	case "remove":
		ci, err = c.RemoveMember(ctx, pos[0])
		msg = "removed " + pos[0]
	case "transfer-leadership":
		to := ""
		if len(pos) == 1 {
			to = pos[0]
		}
		ci, err = transferLeadership(ctx, c, to)
		if err == nil {
			msg = "leader is now " + ci.LeaderID
		}
	}
	if err != nil {
		return err
	}
	if g.json() {
		return printJSONOut(ci)
	}
	fmt.Println(msg)
	return nil
}

// transferLeadership hands leadership on and waits until a node names the
// new leader, so the answer says who leads.
func transferLeadership(ctx context.Context, c *client.Client, to string) (*client.ClusterInfo, error) {
	before, err := c.Cluster(ctx)
	if err != nil {
		return nil, err
	}
	ci, err := c.TransferLeadership(ctx, to)
	if err != nil {
		return nil, err
	}
	for {
		if ci.LeaderID != "" && (ci.LeaderID == to || (to == "" && ci.LeaderID != before.LeaderID)) {
			return ci, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("leadership was handed over, but no node named the new leader in time: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
		if next, err := c.Cluster(ctx); err == nil {
			ci = next
		}
	}
}
