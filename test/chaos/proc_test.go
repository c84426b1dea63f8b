package chaos

import "time"

// killWithin bounds the wait for a SIGKILLed node to be reaped.
const killWithin = 10 * time.Second
