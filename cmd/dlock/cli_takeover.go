package main

import (
	"time"

	"github.com/dlock/dlock/client"
)

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

// heldFlags are what dlock lock and dlock elect share: the flags, and the
// NAME -- CMD [ARGS...] arguments.
type heldFlags struct {
	g                globalFlags
	ttl, wait, grace *time.Duration
	takeover         *bool
}

// register adds the shared flags; what names the held thing in their help.
func (h *heldFlags) register(fs *cmdFlags, ttl time.Duration, what string) {
	h.g.register(fs)
	h.ttl = fs.Duration("ttl", ttl, "lease TTL")
	h.wait = fs.Duration("wait", 0, "give up after waiting this long (0: no limit)")
	h.grace = fs.Duration("grace", 10*time.Second, "SIGTERM to SIGKILL delay when the "+what+" is lost")
	h.takeover = fs.Bool("takeover", false, takeoverFlagUsage)
}

// parse reads NAME -- CMD [ARGS...], checks the flags and opens the client;
// usage is the command line to show when the arguments are wrong. The
// caller closes the client.
func (h *heldFlags) parse(fs *cmdFlags, args []string, usage string) (name string, argv []string, opts []client.MutexOption, c *client.Client, err error) {
	pos, argv, err := parseCmd(fs, &h.g, args, 1)
	if err != nil {
		return "", nil, nil, nil, err
	}
	if len(pos) != 1 || len(argv) == 0 {
		return "", nil, nil, nil, usageErrorf("want a name and a command: %s", usage)
	}
	if *h.wait < 0 || *h.grace < 0 {
		return "", nil, nil, nil, usageErrorf("--wait and --grace must not be negative")
	}
	if opts, err = takeoverOpts(&h.g, *h.takeover); err != nil {
		return "", nil, nil, nil, err
	}
	if c, err = h.g.client(); err != nil {
		return "", nil, nil, nil, err
	}
	return pos[0], argv, append(opts, client.WithTTL(*h.ttl)), c, nil
}
