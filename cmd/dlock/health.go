package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func newHealthCmd() *cobra.Command {
	var url string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health [--url URL] [--timeout D]",
		Short: "exit 0 if the node answers /readyz with 200 (container health checks)",
		Long: `Asks a node whether it is ready (GET /readyz; --url .../healthz asks whether it
is alive) and exits 0 if it answers 200, 1 otherwise, printing why. It is the
health check of images without a shell or curl (deploy/Dockerfile).`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(_ *cobra.Command, _ []string) error {
			hc := &http.Client{Timeout: timeout}
			res, err := hc.Get(url)
			if err != nil {
				return fmt.Errorf("not healthy: %w", err)
			}
			defer res.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("not healthy: %s: %s", res.Status, strings.TrimSpace(string(body)))
			}
			fmt.Println("ok")
			return nil
		},
	}
	def := os.Getenv("DLOCK_HEALTH_URL")
	if def == "" {
		def = "http://127.0.0.1:7070/readyz"
	}
	cmd.Flags().StringVar(&url, "url", def, "`URL` to GET (env DLOCK_HEALTH_URL)")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	return cmd
}
