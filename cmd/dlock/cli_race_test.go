//go:build race

package main

// raceEnabled: the dlock binary under test is built with -race too.
const raceEnabled = true
