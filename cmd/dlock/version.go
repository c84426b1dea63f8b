package main

import (
	"flag"
	"fmt"

	"github.com/dlock/dlock/internal/buildinfo"
)

const versionUsage = `Usage: dlock version [-o json]

Prints dlock's version, the commit it was built from ("(modified)" if the tree
had uncommitted changes) and the Go version. A release build stamps the
version with -ldflags "-X github.com/dlock/dlock/internal/buildinfo.Version=vX.Y.Z".
`

func runVersion(args []string) error {
	fs := flag.NewFlagSet("dlock version", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), versionUsage) }
	var output string
	fs.StringVar(&output, "o", "human", "output: human or json")
	fs.StringVar(&output, "output", "human", "output: human or json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch output {
	case "json":
		return printJSONOut(buildinfo.Get())
	case "human":
		fmt.Println(buildinfo.Get())
		return nil
	}
	return usageErrorf("-o %q: use human or json", output)
}
