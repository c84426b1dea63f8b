// Package buildinfo says which build of dlock is running: the version stamped
// at release (-ldflags "-X github.com/dlock/dlock/internal/buildinfo.Version=v1.2.3"),
// and the commit and Go version the Go toolchain records in every binary.
package buildinfo

import (
	"runtime/debug"
	"sync"
)

// Version is the release version; "dev" for a build that was not stamped.
var Version = "dev"

// Info is what a build knows about itself.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
	GoVersion string `json:"go_version"`
}

var read = sync.OnceValue(func() Info {
	in := Info{Version: Version, Commit: "unknown", GoVersion: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return in
	}
	in.GoVersion = bi.GoVersion
	if in.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		in.Version = bi.Main.Version // go install github.com/dlock/dlock/cmd/dlock@vX
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
})

// Get returns this binary's build information.
func Get() Info { return read() }

// String is the one-line form `dlock version` prints.
func (i Info) String() string {
	c := i.Commit
	if i.Modified {
		c += " (modified)"
	}
	return "dlock " + i.Version + " commit " + c + " " + i.GoVersion
}
