package service

import (
	"net/url"
	"strings"

	"github.com/dlock/dlock/internal/state"
)

// MemberOrigin reports whether a browser Origin ("http://host:port") is the
// API address of a current cluster member, so a page served by one node
// (a console) may call the others. The protocol APIs refuse other foreign
// origins.
func (s *Service) MemberOrigin(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	found := false
	s.fsm.Read(func(st *state.State) {
		for _, m := range st.Members() {
			addr := m.APIAddr
			if i := strings.Index(addr, "://"); i >= 0 {
				addr = addr[i+3:]
			}
			if addr != "" && strings.EqualFold(strings.TrimRight(addr, "/"), u.Host) {
				found = true
				return
			}
		}
	})
	return found
}
