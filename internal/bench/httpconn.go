package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// httpCaller sends the load generator's calls to dlock over plain HTTP/1.1
// keep-alive connections that it owns, one request at a time per
// connection, writing the request and parsing the answer on the caller's
// goroutine (with fasthttp's request writer and response parser).
//
// It exists because the load generator shares the machine's two cores with
// the servers it measures. Go's net/http client hands every request to two
// more goroutines per connection (its write and read loops) and allocates
// a request, a response and header maps per call: measured here, it cost the
// load generator about 130 µs of CPU per lock+unlock cycle against about
// 70 µs this way (docs/benchmarks.md) — CPU the
// servers did not get. Per call it is now about what etcd's gRPC client
// costs the etcd rows.
//
// Cancelling a call's context interrupts that call's connection only (its
// deadline is moved to the past), as net/http does; a call that fails in any
// way closes its connection.
type httpCaller struct {
	dialer  net.Dialer
	maxIdle int           // idle connections kept per host
	timeout time.Duration // bound on a call whose context has no earlier deadline

	mu   sync.Mutex
	idle map[string][]*httpConn // by host:port, most recently used last
}

type httpConn struct {
	nc       net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	lastUsed time.Time
	// interrupted: the last call's cancellation moved the deadline.
	interrupted bool
}

// maxAnswerBytes bounds an answer body (a list of a million locks is far
// below it; the bench never asks for one).
const maxAnswerBytes = 64 << 20

// idleReuse is how long an idle connection is reused: well below the time
// after which dlock closes an idle keep-alive connection (--idle-timeout,
// 2 minutes), since a POST sent on one it has just closed fails and is not
// sent again (it could have been acted on).
const idleReuse = 30 * time.Second

func newHTTPCaller(maxIdle int, timeout time.Duration) *httpCaller {
	return &httpCaller{dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle, timeout: timeout, idle: map[string][]*httpConn{}}
}

// call sends one request (body nil for none; otherwise JSON) to rawURL, an
// http:// URL, and hands the answer's status and body to read, whose body
// slice is valid only during the call.
func (h *httpCaller) call(ctx context.Context, method, rawURL string, body []byte, read func(status int, body []byte) error) error {
	rest, ok := strings.CutPrefix(rawURL, "http://")
	if !ok {
		return fmt.Errorf("%s: dlock bench speaks plain HTTP only (an http:// endpoint)", rawURL)
	}
	host, _, _ := strings.Cut(rest, "/")
	if err := ctx.Err(); err != nil {
		return err
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(rawURL)
	// Sent as given: "%2F" inside a lock name stays escaped.
	req.URI().DisablePathNormalizing = true
	req.Header.SetMethod(method)
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)

	c, err := h.conn(ctx, host)
	if err != nil {
		return err
	}
	if err := h.roundTrip(ctx, c, req, resp); err != nil {
		c.nc.Close() // an answer may still be owed on it
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		} else if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			// The connection's deadline, which is the context's, can
			// pass a moment before the context's own timer fires.
			err = context.DeadlineExceeded
		}
		return fmt.Errorf("%s %s: %w", method, rawURL, err)
	}
	rerr := read(resp.StatusCode(), resp.Body())
	if c.interrupted || resp.ConnectionClose() {
		c.nc.Close()
	} else {
		h.put(host, c)
	}
	return rerr
}

// roundTrip writes req on c and reads the answer into resp, within the
// context's deadline (or the caller's timeout) and until it is cancelled.
// A failed call is not sent again: a POST may have been acted on.
func (h *httpCaller) roundTrip(ctx context.Context, c *httpConn, req *fasthttp.Request, resp *fasthttp.Response) error {
	deadline := time.Now().Add(h.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return err
	}
	// A cancelled context moves this connection's deadline to the past,
	// which ends the write or read in progress at once. If that raced with
	// the answer, the connection is not reused: the move may come after the
	// next call has set its own deadline.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer func() { c.interrupted = !stop() }()
	if err := req.Write(c.bw); err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}
	return resp.ReadLimitBody(c.br, maxAnswerBytes)
}

// conn returns an idle connection to host, or a new one.
func (h *httpCaller) conn(ctx context.Context, host string) (*httpConn, error) {
	h.mu.Lock()
	for list := h.idle[host]; len(list) > 0; list = h.idle[host] {
		c := list[len(list)-1]
		h.idle[host] = list[:len(list)-1]
		if time.Since(c.lastUsed) < idleReuse {
			h.mu.Unlock()
			return c, nil
		}
		c.nc.Close()
	}
	h.mu.Unlock()
	return h.dial(ctx, host)
}

func (h *httpCaller) dial(ctx context.Context, host string) (*httpConn, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	nc, err := h.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	return &httpConn{nc: nc, br: bufio.NewReaderSize(nc, 8<<10), bw: bufio.NewWriterSize(nc, 4<<10)}, nil
}

// put keeps c for the next call to host, or closes it when enough are kept.
func (h *httpCaller) put(host string, c *httpConn) {
	c.lastUsed = time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.idle[host]) >= h.maxIdle {
		c.nc.Close()
		return
	}
	h.idle[host] = append(h.idle[host], c)
}

// close closes every idle connection.
func (h *httpCaller) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for host, list := range h.idle {
		for _, c := range list {
			c.nc.Close()
		}
		delete(h.idle, host)
	}
}
