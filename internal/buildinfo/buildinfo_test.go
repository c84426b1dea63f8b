package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestGetNamesVersionAndGo(t *testing.T) {
	in := Get()
	if in.Version == "" || in.GoVersion != runtime.Version() || in.Commit == "" {
		t.Fatalf("build info %+v", in)
	}
	if s := in.String(); !strings.HasPrefix(s, "dlock "+in.Version+" commit ") || !strings.HasSuffix(s, runtime.Version()) {
		t.Fatalf("String() = %q", s)
	}
}
