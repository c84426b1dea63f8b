package main

// The client commands (lock, elect, acquire, release, renew, status, list,
// watch, members): flags and output only; the behaviour is package client's.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"strings"
	"time"

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

const clientUsageFooter = `
Common flags:
  --endpoints URLS   comma-separated node URLs (env DLOCK_ENDPOINTS; default ` + defaultEndpoints + `)
  --client-id ID     holder id (env DLOCK_CLIENT_ID; default USER@HOSTNAME for
                     acquire, renew and release, whose lease spans runs, and
                     hostname-pid-random for the others)
  --cacert FILE      CA of the nodes' https certificates (env DLOCK_CACERT;
                     default: system roots); makes the default endpoints https
  --cert FILE, --key FILE
                     client certificate and its key, for clusters that ask
                     for one (env DLOCK_CERT, DLOCK_KEY)
  --acl-token SECRET ACL token (env DLOCK_ACL_TOKEN), for clusters run with --acl
  -o, --output FMT   human (default) or json
  --timeout D        give up on an unreachable cluster after D (default 30s)
  -v                 log retries to stderr

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

func (g *globalFlags) register(fs *cmdFlags) {
	def := os.Getenv("DLOCK_ENDPOINTS")
	if def == "" {
		def = defaultEndpoints
	}
	fs.StringVar(&g.endpoints, "endpoints", def, "comma-separated node URLs (env DLOCK_ENDPOINTS)")
	fs.StringVar(&g.clientID, "client-id", os.Getenv("DLOCK_CLIENT_ID"), "holder id (env DLOCK_CLIENT_ID; default USER@HOSTNAME for acquire, renew and release, else hostname-pid-random)")
	g.registerTLS(fs.FlagSet)
	fs.StringVar(&g.token, "acl-token", aclTokenEnv(), "ACL token secret (env DLOCK_ACL_TOKEN); --token is the fencing token of release and renew")
	fs.StringVar(&g.output, "o", "human", "output: human or json")
	fs.StringVar(&g.output, "output", "human", "output: human or json")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "give up on an unreachable cluster after this long")
	fs.BoolVar(&g.verbose, "v", false, "log retries to stderr")
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

// usageError is a mistake on the command line: exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return cliExitOK
	case errors.As(err, &ue), errors.Is(err, errUsage):
		return cliExitUsage
	case errors.Is(err, client.ErrLeaseLost), errors.Is(err, client.ErrNotHolder):
		return cliExitLost
	case errors.Is(err, client.ErrLockHeld), errors.Is(err, client.ErrWaitTimeout), errors.Is(err, client.ErrLockLost):
		return cliExitHeld
	}
	return cliExitError
}

// cmdFlags is a client command's flag set and its help text.
type cmdFlags struct {
	*flag.FlagSet
	usage string
}

// newCmdFlags returns a quiet flag set: parse errors are printed once, by
// runClientCommand, and -h prints usage with the common flags.
func newCmdFlags(name, usage string) *cmdFlags {
	fs := flag.NewFlagSet("dlock "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &cmdFlags{fs, usage}
}

// parseInterspersed parses flags placed anywhere among up to npos positional
// arguments. What follows "--", or follows the last positional argument
// expected, is returned as rest, untouched: it is a command and its own
// flags.
func parseInterspersed(fs *flag.FlagSet, args []string, npos int) (pos, rest []string, err error) {
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		left := fs.Args()
		if i := len(args) - len(left); i > 0 && args[i-1] == "--" {
			return pos, left, nil
		}
		if len(left) == 0 {
			return pos, nil, nil
		}
		if len(pos) == npos {
			return pos, left, nil
		}
		pos = append(pos, left[0])
		args = left[1:]
	}
}

// runClientCommand runs a client subcommand and returns its exit code.
func runClientCommand(name string, args []string) int {
	var err error
	switch name {
	case "lock":
		err = runLockCommand(args)
	case "acquire":
		err = runAcquire(args)
	case "release":
		err = runRelease(args)
	case "renew":
		err = runRenew(args)
	case "status":
		err = runStatus(args)
	case "list":
		err = runList(args)
	case "members":
		err = runMembers(args)
	case "elect":
		err = runElect(args)
	case "watch":
		err = runWatch(args)
	case "acl":
		err = runACL(args)
	default:
		err = usageErrorf("unknown command")
	}
	var ec *exitCodeError
	var ue *usageError
	switch {
	case errors.As(err, &ec):
		return ec.code
	case errors.Is(err, flag.ErrHelp):
		return cliExitOK
	case err != nil && wantsJSON(args):
		printJSONError(err)
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "dlock %s: %v (see dlock %s -h)\n", name, err, name)
	case err != nil:
		fmt.Fprintf(os.Stderr, "dlock %s: %v\n", name, err)
	}
	return exitCode(err)
}

// wantsJSON reports whether the command line asked for -o json (before any
// "--": what follows is a command's own arguments).
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "-o=json", a == "--output=json", a == "-output=json":
			return true
		case (a == "-o" || a == "--output" || a == "-output") && i+1 < len(args) && args[i+1] == "json":
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

// exitCodeError ends a command with a given code, its messages already
// printed (lock passes its command's exit code through this way).
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// parse wraps parseInterspersed for the client commands: flag errors are usage
// errors, -h prints the usage, and the global flags are checked.
func parseCmd(fs *cmdFlags, g *globalFlags, args []string, npos int) (pos, rest []string, err error) {
	pos, rest, err = parseInterspersed(fs.FlagSet, args, npos)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(os.Stdout, fs.usage, clientUsageFooter)
		return nil, nil, err
	}
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, "parse error") {
			msg += " (durations need a unit, e.g. 30s, 5m or 1h)"
		}
		return nil, nil, &usageError{msg}
	}
	return pos, rest, g.check()
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
