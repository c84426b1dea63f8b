package service

import (
	"net"
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

// SetBrowserHosts names further hosts (as a browser's Host header gives
// them, host or host:port) that browser pages may use to reach this node:
// the names behind a reverse proxy or an ingress (dlock serve
// --browser-hosts).
func (s *Service) SetBrowserHosts(hosts []string) {
	m := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		if h = strings.ToLower(strings.TrimSpace(h)); h != "" {
			m[h] = true
		}
	}
	s.browserHosts.Store(&m)
}

// BrowserHost reports whether a browser may reach this node under the name
// in its Host header: an IP address, localhost, a current member's API
// address, or a host given to SetBrowserHosts. Any other name may be an
// attacker's own, rebound to this node's address after its page loaded
// (DNS rebinding): the page's requests are then same-origin, and Origin
// alone cannot tell them from the node's own pages.
func (s *Service) BrowserHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if m := s.browserHosts.Load(); m != nil && ((*m)[host] || (*m)[strings.ToLower(hostport)]) {
		return true
	}
	return s.MemberOrigin("http://" + hostport)
}
