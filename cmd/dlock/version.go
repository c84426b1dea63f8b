package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dlock/dlock/internal/buildinfo"
)

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o json]",
		Short: "print the version, commit and Go version",
		Long: `Prints dlock's version, the commit it was built from ("(modified)" if the tree
had uncommitted changes) and the Go version. A release build stamps the
version with -ldflags "-X github.com/dlock/dlock/internal/buildinfo.Version=vX.Y.Z".`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE:              func(_ *cobra.Command, _ []string) error { return printVersion(output) },
	}
	cmd.Flags().StringVarP(&output, "output", "o", "human", "output `FORMAT`: human or json")
	completeWords(cmd, "output", "human", "json")
	return cmd
}

func printVersion(output string) error {
	switch output {
	case "json":
		return printJSONOut(buildinfo.Get())
	case "human":
		fmt.Println(buildinfo.Get())
		return nil
	}
	return usageErrorf("-o %q: use human or json", output)
}
