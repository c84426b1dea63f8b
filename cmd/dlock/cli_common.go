package main

// The client commands (lock, elect, acquire, release, renew, status, list,
// watch, members): flags and output only; the behaviour is package client's.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dlock/dlock/client"
)

// Exit codes of the client commands (also in the usage text and docs).
const (
	cliExitOK    = 0
	cliExitError = 1
	cliExitUsage = 2
	cliExitHeld  = 3 // not acquired: held by someone else, the wait timed out, or the grant was lost before the answer
	cliExitLost  = 4 // lock lost while running the command, or not the holder
)

const defaultEndpoints = "http://127.0.0.1:7070,http://127.0.0.1:7080,http://127.0.0.1:7090"

// clientUsageFooter closes every client command's help.
const clientUsageFooter = `
Exit codes: 0 ok, 1 error, 2 usage, 3 lock held or wait timed out,
4 lock lost (lock), leadership lost (elect) or not the holder (release, renew).
`

// globalFlags are the flags every client command takes.
type globalFlags struct {
	endpoints string
	clientID  string
	cacert    string
	cert      string
	key       string
	token     string
	output    string
	timeout   time.Duration
	verbose   bool
	// stableID: without --client-id, act as the same client on every run
	// (acquire, renew and release span runs); see stableClientID.
	stableID bool
}

// stableClientID is the default client id of the commands whose lease spans
// several runs (acquire, renew, release): the same user on the same host is
// the same client, so a release finds the lock its acquire took. It implies
// no takeover: another run's acquire under this id waits in line like anyone.
func stableClientID() string {
	who := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		who = u.Username
	}
	host, _ := os.Hostname()
	id := printable(who) + "@" + printable(host)
	if len(id) > 128 {
		id = id[:128]
	}
	return id
}

// printable replaces what a client id may not contain (spaces, non-ASCII).
func printable(s string) string {
	if s == "" {
		return "unknown"
	}
	b := []byte(s)
	for i, c := range b {
		if c < 0x21 || c > 0x7e {
			b[i] = '_'
		}
	}
	return string(b)
}

func (g *globalFlags) register(fs *pflag.FlagSet) {
	def := os.Getenv("DLOCK_ENDPOINTS")
	if def == "" {
		def = defaultEndpoints
	}
	fs.StringVar(&g.endpoints, "endpoints", def, "comma-separated node `URLS` (env DLOCK_ENDPOINTS)")
	fs.StringVar(&g.clientID, "client-id", os.Getenv("DLOCK_CLIENT_ID"), "holder `ID` (env DLOCK_CLIENT_ID; default USER@HOSTNAME for acquire, renew and release, whose lease spans runs, and hostname-pid-random for the others)")
	g.registerTLS(fs)
	fs.StringVar(&g.token, "acl-token", aclTokenEnv(), "ACL token `SECRET` (env DLOCK_ACL_TOKEN), for clusters run with --acl; --token is the fencing token of release and renew")
	fs.StringVarP(&g.output, "output", "o", "human", "output `FORMAT`: human or json")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "give up on an unreachable cluster after this long")
	fs.BoolVarP(&g.verbose, "verbose", "v", false, "log retries to stderr")
}

// clientCmd makes cmd a client command: the common flags (g), -o json
// errors, completion of -o, and the exit codes under its help.
func clientCmd(cmd *cobra.Command, g *globalFlags) *cobra.Command {
	g.register(cmd.Flags())
	completeWords(cmd, "output", "human", "json")
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[clientAnnotation] = "true"
	cmd.SetUsageTemplate(usageTemplate + clientUsageFooter)
	cmd.Flags().SortFlags = false // the command's own flags first, then the common ones
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(c *cobra.Command, args []string) error {
			if err := g.check(); err != nil {
				return err
			}
			return run(c, args)
		}
	}
	return cmd
}

func (g *globalFlags) check() error {
	if g.output != "human" && g.output != "json" {
		return usageErrorf("-o %q: use human or json", g.output)
	}
	if g.timeout <= 0 {
		return usageErrorf("--timeout must be positive")
	}
	return nil
}

func (g *globalFlags) client() (*client.Client, error) {
	tlsCfg, err := g.tls()
	if err != nil {
		return nil, err
	}
	var eps []string
	for e := range strings.SplitSeq(g.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if g.clientID == "" && g.stableID {
		g.clientID = stableClientID()
	}
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelDebug
	}
	return client.New(client.Config{Endpoints: eps, ClientID: g.clientID, TLS: tlsCfg, Token: g.token, UnreachableTimeout: g.timeout,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))})
}

// connect returns a client and the command's deadline (--timeout plus
// extra, for time spent waiting in line), and a function that ends both.
func (g *globalFlags) connect(extra time.Duration) (*client.Client, context.Context, func(), error) {
	c, err := g.client()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout+extra)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

func (g *globalFlags) json() bool { return g.output == "json" }

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return cliExitOK
	case errors.As(err, &ue):
		return cliExitUsage
	case errors.Is(err, client.ErrLeaseLost), errors.Is(err, client.ErrNotHolder):
		return cliExitLost
	case errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrWaitTimeout), errors.Is(err, client.ErrLockLost):
		return cliExitHeld
	}
	return cliExitError
}

// wantsJSON reports whether the command line asked for -o json (before any
// "--": what follows is a command's own arguments).
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-o=json", a == "-ojson", a == "--output=json":
			return true
		case (a == "-o" || a == "--output") && i+1 < len(args) && args[i+1] == "json":
			return true
		}
	}
	return false
}

// printJSONError prints err in the API's error shape on stdout, where a
// script reading -o json looks.
func printJSONError(err error) {
	code, msg := "error", err.Error()
	var ae *client.APIError
	var ue *usageError
	switch {
	case errors.As(err, &ae) && ae.Code != "":
		code = ae.Code
	case errors.As(err, &ue):
		code = "usage"
	case errors.Is(err, client.ErrUnavailable):
		code = "unavailable"
	}
	body := map[string]any{"error": map[string]any{"code": code, "message": msg, "exit_code": exitCode(err)}}
	if ae != nil && ae.Holder != nil {
		body["holder"] = ae.Holder
	}
	_ = printJSONOut(body)
}

func printJSONOut(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func showTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}
