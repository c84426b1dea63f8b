//go:build !unix

package demo

import (
	"errors"
	"os"
)

var errNoPause = errors.New("freezing a process needs SIGSTOP, which only Unix systems have; run the demo on Linux or macOS")

func pause(*os.Process) error { return errNoPause }

func resume(*os.Process) error { return errNoPause }
