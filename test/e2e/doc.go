// Package e2e tests dlock as users run it: real dlock processes on loopback, killed with SIGKILL and restarted from their data dirs.
//
// The package has only tests; run them with
//
//	go test -race -count=1 ./test/e2e/
//
// They build the dlock binary once (with -race when the tests are built with
// it), start clusters of `dlock serve` processes and a `dlock dev` process, and
// talk to them over plain HTTP/JSON, the way a user with curl would.
package e2e
