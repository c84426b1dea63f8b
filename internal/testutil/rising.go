package testutil

import "fmt"

// Rising checks that each name's fencing tokens, in the order they were
// granted, only rise: the promise every range change (split, move) keeps.
func Rising(seqs map[string][]uint64) error {
	for name, s := range seqs {
		for i := 1; i < len(s); i++ {
			if s[i] <= s[i-1] {
				return fmt.Errorf("%s: token %d after %d", name, s[i], s[i-1])
			}
		}
	}
	return nil
}
