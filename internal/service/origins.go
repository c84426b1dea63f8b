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

// MemberOrigins lists the current members' API origins with the given scheme
// ("http" or "https"): where a console page served by one node may turn
// when that node goes away.
func (s *Service) MemberOrigins(scheme string) []string {
	var out []string
	s.fsm.Read(func(st *state.State) {
		for _, m := range st.Members() {
			addr := m.APIAddr
			if i := strings.Index(addr, "://"); i >= 0 {
				addr = addr[i+3:]
			}
			if addr = strings.TrimRight(addr, "/"); addr != "" {
				out = append(out, scheme+"://"+addr)
			}
		}
	})
	return out
}
