package state

import "github.com/dlock/dlock/internal/command"

// aclChanged emits EventACLChanged when an ACL command r revoked or replaced
// an existing token, so each node's service ends the streams and waits that
// token started there. Creating a new token ends nothing.
func (s *State) aclChanged(existed bool, accessor [16]byte, r command.Result) command.Result {
	if existed && r.Status == command.StatusOK {
		s.emit(Event{Type: EventACLChanged, Accessor: accessor})
	}
	return r
}
