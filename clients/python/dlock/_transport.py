"""HTTP to a dlock cluster: leader discovery, failover, retries.

One logical request keeps one request id across every retry, so the
cluster answers a retry with the first attempt's outcome and never acts
twice; retries back off with jitter, and each attempt goes to the leader
when it is known (followers would forward it), else to the next endpoint.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import random
import secrets
import socket
import ssl
import threading
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from . import errors

BACKOFF_MIN = 0.02
BACKOFF_MAX = 1.0
# How often the leader is asked for when it is unknown.
DISCOVER_EVERY = 1.0
# How long a leader address that could not be dialled is not used.
DISTRUST_FOR = 10.0
MAX_ANSWER = 4 << 20
USER_AGENT = "dlock-python-client"


def new_request_id() -> str:
    """Names one logical request; every retry of it carries the same id."""
    return "py-" + secrets.token_hex(12)


def jitter(d: float) -> float:
    """A random duration in [d/2, d): spreads the retries of many clients."""
    return d / 2 + random.random() * d / 2


def normalize_endpoint(e: str, tls: bool) -> str:
    e = e.strip()
    if "://" not in e:
        e = ("https://" if tls else "http://") + e
    u = urlsplit(e)
    if u.scheme not in ("http", "https") or not u.netloc or u.path not in ("", "/") or u.query:
        raise errors.InvalidArgument(f"endpoint {e!r}: want a base URL like http://127.0.0.1:7070")
    return f"{u.scheme}://{u.netloc}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def leader_base(frm: str, addr: str) -> str:
    """The leader's advertised host:port as a base URL with the scheme of
    the node that named it, or "" for an address this client cannot mean
    (no host, 0.0.0.0, or loopback named by a node reached over the network)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port:
        return ""
    try:
        if ipaddress.ip_address(host.strip("[]")).is_unspecified:
            return ""
    except ValueError:
        pass
    scheme, _, from_host = frm.partition("://")
    fh = from_host.rpartition(":")[0] or from_host
    if _is_loopback(host) and not _is_loopback(fh):
        return ""
    return f"{scheme}://{addr}"


class NotSent(Exception):
    """An attempt that certainly never reached a node (the connection could
    not be opened)."""


class Transport:
    """Sends requests to a cluster. Safe for use from many threads."""

    def __init__(self, endpoints: List[str], *, token: str = "", request_timeout: float = 10.0,
                 ssl_context: Optional[ssl.SSLContext] = None, logger: Any = None) -> None:
        if not endpoints:
            raise errors.InvalidArgument("no endpoints; give the URL of at least one node, e.g. http://127.0.0.1:7070")
        seen: List[str] = []
        for e in endpoints:
            b = normalize_endpoint(e, ssl_context is not None)
            if b not in seen:
                seen.append(b)
        self.endpoints = seen
        self.token = token
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self.log = logger
        self._mu = threading.Lock()
        self._leader = ""
        self._last_asked = -1e9
        self._next = random.randrange(len(self.endpoints))
        self._not_before: Dict[str, float] = {}
        self._distrust: Dict[str, float] = {}

    # -- one attempt ---------------------------------------------------------

    def connect(self, base: str, timeout: float) -> http.client.HTTPConnection:
        u = urlsplit(base)
        if u.scheme == "https":
            ctx = self.ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(u.netloc, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(u.netloc, timeout=timeout)

    def headers(self, request_id: str = "", body: bool = False, accept: str = "application/json") -> Dict[str, str]:
        h = {"Accept": accept, "User-Agent": USER_AGENT}
        if body:
            h["Content-Type"] = "application/json"
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if request_id:
            h["X-Request-Id"] = request_id
        return h

    def attempt(self, base: str, method: str, path: str, body: Optional[bytes], timeout: float,
                request_id: str) -> Tuple[int, Dict[str, str], bytes]:
        """One try to one node. Raises NotSent if the connection could not be
        opened, OSError if it broke after that (the request may have arrived)."""
        conn = self.connect(base, timeout)
        try:
            try:
                conn.connect()
            except OSError as e:
                raise NotSent(f"{base}: {e}") from e
            conn.request(method, "/api/v1" + path, body=body, headers=self.headers(request_id, body is not None))
            res = conn.getresponse()
            data = res.read(MAX_ANSWER)
            return res.status, {k.lower(): v for k, v in res.getheaders()}, data
        finally:
            conn.close()

    # -- choosing a node -------------------------------------------------------

    def target(self) -> Tuple[str, float]:
        """The node for the next attempt: the leader if known, else the next
        endpoint in turn, skipping nodes that asked to be left alone; if all
        did, also how long until the first may be asked again."""
        with self._mu:
            now = time.monotonic()
            if self._leader and now >= self._not_before.get(self._leader, 0):
                return self._leader, 0.0
            soonest = None
            for _ in self.endpoints:
                base = self.endpoints[self._next % len(self.endpoints)]
                self._next += 1
                nb = self._not_before.get(base, 0)
                if now >= nb:
                    return base, 0.0
                soonest = nb if soonest is None else min(soonest, nb)
            return self.endpoints[self._next % len(self.endpoints)], max(0.0, (soonest or now) - now)

    def failed(self, base: str, retry_after: float = 0.0, undialable: bool = False) -> None:
        """A node could not answer: it is no longer taken for the leader, and
        with a Retry-After it is not asked before then."""
        with self._mu:
            if self._leader == base:
                self._leader = ""
                if undialable:
                    self._distrust[base] = time.monotonic() + DISTRUST_FOR
            if retry_after > 0:
                self._not_before[base] = time.monotonic() + retry_after
            else:
                self._not_before.pop(base, None)

    def forget_leader(self) -> None:
        with self._mu:
            self._leader = ""

    def discover(self) -> None:
        """Asks a node for the leader, at most once a second while it is
        unknown. Any node would do (followers forward), so a failure here only
        costs the shortcut."""
        with self._mu:
            now = time.monotonic()
            if self._leader or now - self._last_asked < DISCOVER_EVERY:
                return
            self._last_asked = now
            base = self.endpoints[self._next % len(self.endpoints)]
        try:
            status, _, data = self.attempt(base, "GET", "/cluster", None, min(1.0, self.request_timeout), "")
            if status != 200:
                return
            info = json.loads(data)
        except (NotSent, OSError, ValueError, http.client.HTTPException):
            return
        leader = leader_base(base, str(info.get("leader_api_addr", "")))
        if not leader:
            return
        with self._mu:
            if time.monotonic() < self._distrust.get(leader, 0):
                return
            self._distrust.pop(leader, None)
            self._leader = leader

    # -- one logical request -------------------------------------------------------

    def call(self, method: str, path: str, body: Any = None, *, request_id: str = "",
             attempt_timeout: Optional[float] = None, deadline: Optional[float] = None,
             what: str = "", progress: Optional[Dict[str, Any]] = None) -> Tuple[Optional[float], Any]:
        """Sends a request, retrying on other nodes until an answer that is not
        a passing failure, or until deadline (time.monotonic(); None: retry
        for as long as it takes). Returns (sent, answer): sent is the
        time.monotonic() at which the first attempt that may have reached a
        node was sent (None if none may have): whatever the request did, it
        did after that moment, so it is the safe start of a lease's TTL.

        Raises the errors.DlockError of the answer; errors.Unavailable once
        the deadline passes without one. Every error carries .sent; progress,
        if given, gets progress["sent"] as soon as it is known, for a caller
        interrupted by anything else (KeyboardInterrupt).
        """
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        timeout = attempt_timeout or self.request_timeout
        what = what or f"{method} {path}"
        sent: Optional[float] = None
        last: Optional[BaseException] = None
        backoff = BACKOFF_MIN
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise _gave_up(what, last, sent)
            self.discover()
            base, wait = self.target()
            if wait > 0:
                self._sleep(wait, deadline)
                continue
            t = timeout if deadline is None else max(0.05, min(timeout, deadline - now))
            start = time.monotonic()
            if progress is not None and sent is None:
                # Interrupted mid-attempt, the request may have arrived.
                progress["maybe"] = start
            try:
                status, hdrs, answer = self.attempt(base, method, path, data, t, request_id)
            except NotSent as e:
                last = errors.Unavailable(str(e))
                self.failed(base, undialable=True)
            except (OSError, http.client.HTTPException) as e:
                if sent is None:
                    sent = start
                    if progress is not None:
                        progress["sent"] = sent
                last = errors.Unavailable(f"{base}: {e.__class__.__name__}: {e}")
                self.failed(base)
            else:
                if sent is None:
                    sent = start
                    if progress is not None:
                        progress["sent"] = sent
                parsed: Any = None
                if answer:
                    try:
                        parsed = json.loads(answer)
                    except ValueError:
                        parsed = None
                if 200 <= status < 300:
                    return sent, parsed
                err = errors.from_answer(status, parsed, answer.decode("utf-8", "replace"))
                err.sent = sent  # type: ignore[attr-defined]
                if status not in (429, 502, 503, 504):
                    raise err
                last = err
                self.failed(base, _retry_after(hdrs.get("retry-after", "")))
            if self.log is not None:
                self.log.debug("dlock: retrying %s on another node: %s", what, last)
            self._sleep(jitter(backoff), deadline)
            backoff = min(2 * backoff, BACKOFF_MAX)

    @staticmethod
    def _sleep(d: float, deadline: Optional[float]) -> None:
        if deadline is not None:
            d = min(d, max(0.0, deadline - time.monotonic()))
        if d > 0:
            time.sleep(d)


def _retry_after(v: str) -> float:
    try:
        s = int(v)
    except ValueError:
        return 0.0
    return float(s) if s > 0 else 0.0


def _gave_up(what: str, last: Optional[BaseException], sent: Optional[float]) -> errors.DlockError:
    if isinstance(last, errors.DlockError) and isinstance(last, errors.Unavailable):
        e = type(last)(f"{what}: gave up: {last.message}", code=last.code, status=last.status, body=last.body)
    else:
        e = errors.Unavailable(f"{what}: no node answered in time" + (f" (last error: {last})" if last else ""))
    e.sent = sent  # type: ignore[attr-defined]
    return e


def set_socket_timeout(res: http.client.HTTPResponse, timeout: float) -> None:
    """Bounds each read of a stream (silence longer than this breaks it)."""
    sock = getattr(getattr(res, "fp", None), "raw", None)
    sock = getattr(sock, "_sock", None)
    if isinstance(sock, socket.socket):
        sock.settimeout(timeout)
