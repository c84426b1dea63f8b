package main

// Usage conventions shared by every command: -h, --help and "help" print the
// usage to stdout and exit 0; a mistake on the command line prints the error
// first, then a hint, and exits 2.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/dlock/dlock/internal/raftnode"
)

// wantsHelp reports whether args ask for help instead of naming a subcommand.
func wantsHelp(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
}

// printHelp prints usage to stdout and returns flag.ErrHelp, which every
// command maps to exit 0.
func printHelp(usage string) error {
	fmt.Fprint(os.Stdout, usage)
	return flag.ErrHelp
}

// parseFlags parses a server-side or admin command's flags: help goes to
// stdout (flag.ErrHelp), a bad flag becomes a usage error (exit 2) that
// names the flag, and nothing is printed here.
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(os.Stdout)
		if usage != nil {
			usage()
		} else {
			fs.PrintDefaults()
		}
		return flag.ErrHelp
	}
	if err != nil {
		return &usageError{err.Error()}
	}
	return nil
}

// finish maps a top-level command's error to its exit code and message.
func finish(cmd string, err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return cliExitOK
	case errors.As(err, &ue), errors.Is(err, errUsage):
		if !errors.Is(err, errUsage) {
			fmt.Fprintf(os.Stderr, "dlock %s: %v\n", cmd, err)
		}
		fmt.Fprintf(os.Stderr, "Run 'dlock %s --help' for usage.\n", cmd)
		return cliExitUsage
	}
	fmt.Fprintf(os.Stderr, "dlock %s: %v\n", cmd, err)
	var refused *raftnode.RefusedError
	if errors.As(err, &refused) {
		// Restarting will not help: an operator must act (deploy/systemd's
		// unit does not restart on this code).
		return serveExitRefused
	}
	return cliExitError
}

// serveExitRefused is dlock serve's exit code when it refuses its data dir
// (corrupted or truncated log or snapshot).
const serveExitRefused = 3
