package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

const healthUsage = `Usage: dlock health [--url URL] [--timeout D]

Asks a node whether it is ready (GET /readyz; --url .../healthz asks whether it
is alive) and exits 0 if it answers 200, 1 otherwise, printing why. It is the
health check of images without a shell or curl (deploy/Dockerfile).

  --url URL    default http://127.0.0.1:7070/readyz (env DLOCK_HEALTH_URL)
  --timeout D  give up after D (default 3s)
`

func runHealth(args []string) error {
	fs := flag.NewFlagSet("dlock health", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), healthUsage) }
	def := os.Getenv("DLOCK_HEALTH_URL")
	if def == "" {
		def = "http://127.0.0.1:7070/readyz"
	}
	url := fs.String("url", def, "URL to GET")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	hc := &http.Client{Timeout: *timeout}
	res, err := hc.Get(*url)
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
}
