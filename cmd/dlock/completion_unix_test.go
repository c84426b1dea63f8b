//go:build unix

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The bash script, loaded into bash as a user's profile would, completes a
// subcommand, a flag and a flag's value by asking the real binary.
func TestBashCompletion(t *testing.T) {
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	needTool(t, "bash")
	needTool(t, bashCompletion)
	script := completionScript(t, "bash")
	bin := buildDlock(t)
	// COMP_* are what bash sets before it calls a completion function.
	const driver = `
source "$BASH_COMPLETION" && source "$SCRIPT" || exit 1
complete -p dlock || exit 1
comp() {
	COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
	__start_dlock dlock "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
	echo "$* => ${COMPREPLY[*]}"
}
comp dlock lo
comp dlock acl to
comp dlock lock deploy --no-w
comp dlock status x -o ''
`
	cmd := exec.Command("bash", "--norc", "--noprofile", "-c", driver)
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "SCRIPT="+script, "BASH_COMPLETION="+bashCompletion,
		"GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	for _, want := range []string{
		"complete -o default -F __start_dlock dlock",
		"dlock lo => lock",
		"dlock acl to => token",
		"dlock lock deploy --no-w => --no-wait",
		"dlock status x -o  => human json",
	} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("bash completion: want %q in\n%s", want, out)
		}
	}
}
