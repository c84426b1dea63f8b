package main

import "github.com/dlock/dlock/client"

const takeoverFlagUsage = "take the lock (or place in line) at once from another lease of the same --client-id"

// takeoverUsage is the --takeover line of acquire, lock and elect.
const takeoverUsage = `  --takeover  take it (or a place in line) at once from another lease of
              the same --client-id: a holder that restarted before its old
              lease ended. Needs --client-id (or DLOCK_CLIENT_ID); with ACLs,
              a token whose client_ids name it. Without it, a lock held
              under the same client id is like any held lock.
`

// takeoverOpts turns --takeover into client options. A takeover only means
// something under a client id chosen on purpose: the default one is new in
// every process, so nothing could be taken over with it.
func takeoverOpts(g *globalFlags, takeover bool) ([]client.MutexOption, error) {
	if !takeover {
		return nil, nil
	}
	if g.clientID == "" {
		return nil, usageErrorf("--takeover needs --client-id (or DLOCK_CLIENT_ID): the id of the lease to take over")
	}
	return []client.MutexOption{client.WithTakeover()}, nil
}
