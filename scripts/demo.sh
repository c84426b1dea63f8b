#!/usr/bin/env bash
# demo.sh — the fencing demo, 5 real nodes and a data store (docs/fencing.md, "The demo"); flags: --keep, --dir DIR.
cd "$(dirname "$0")/.." && exec go run ./cmd/dlock demo "$@"
