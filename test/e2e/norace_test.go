//go:build !race

package e2e

// raceEnabled says the test binary was built with -race, so the dlock binary
// under test is built with it too.
const raceEnabled = false
