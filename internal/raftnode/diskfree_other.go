// Free space is not measured on other platforms: the guard lets writes through.

//go:build !(linux || darwin || freebsd)

package raftnode

import "errors"

func freeSpace(string) (uint64, error) {
	return 0, errors.New("free space is not measured on this platform")
}
