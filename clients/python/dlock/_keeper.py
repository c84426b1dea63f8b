"""What leases, sessions and leaderships share: the moment the client stops
trusting them (``lost``), and the threads that keep them alive."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

from . import errors

log = logging.getLogger("dlock")


#: How many lost grants a session's keeper remembers for late children.
MAX_LOST_REMEMBERED = 1024


class Keeper:
    """Keeps one lease: renews it every TTL/3 and sets ``lost`` the moment it
    may be lost.

    ``sent`` is when the last acquire or renew that the server answered with
    success was sent (its first attempt, time.monotonic()). The server keeps
    the lease at least until sent + TTL, since it counts the TTL from when it
    acted, which was later; so until then no one else can hold what it
    guards, and at that moment ``lost`` is set, by a watchdog thread of its
    own that a renewal stuck in retries cannot delay. A keeper under a parent
    (a lock held under a session) follows the parent instead of renewing.
    """

    def __init__(self, what: str, ttl: float, sent: float,
                 renew: Optional[Callable[[float], float]] = None,
                 parent: Optional["Keeper"] = None,
                 attempt_timeout: float = 10.0) -> None:
        self.what = what
        self.ttl = ttl
        self.lost = threading.Event()
        self.error: Optional[BaseException] = None
        self._sent = sent
        self._renew = renew
        self._parent = parent
        self._attempt_timeout = attempt_timeout
        self._cond = threading.Condition()
        self._threads: list = []
        self._children: set = set()
        #: The fencing token of the grant a keeper under a parent keeps.
        self.token: Optional[int] = None
        # The grants a session's keepalive listed as lost, by token, for a
        # child adopted after the news (bounded).
        self._lost: "OrderedDict[int, BaseException]" = OrderedDict()

    def start(self) -> None:
        if self._parent is not None:
            self._parent._adopt(self)
            return
        self._spawn(self._watchdog)
        if self._renew is not None:
            self._spawn(self._keep_alive)

    def _spawn(self, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=f"dlock {self.what}", daemon=True)
        self._threads.append(t)
        t.start()

    @property
    def bound(self) -> float:
        """time.monotonic() at which the lease counts as lost unless a renewal
        is answered before."""
        with self._cond:
            if self._parent is not None:
                return self._parent.bound
            return self._sent + self.ttl

    def end(self, err: BaseException) -> bool:
        """Sets lost with err, once; reports whether this call did. The
        keepers under this one (locks held under a session) end with it."""
        with self._cond:
            if self.error is not None:
                return False
            self.error = err
            self.lost.set()
            self._cond.notify_all()
            children, self._children = self._children, set()
        for c in children:
            c._parent_ended(err)
        if self._parent is not None:
            self._parent._disown(self)
        return True

    def _adopt(self, child: "Keeper") -> None:
        with self._cond:
            lost = self._lost.get(child.token) if child.token is not None else None
            if self.error is None and lost is None:
                self._children.add(child)
                return
            err = self.error
        if lost is not None:
            if child.end(lost):
                log.warning("dlock: %s lost: %s", child.what, lost)
            return
        child._parent_ended(err)

    def lost_grant(self, token: int, err: BaseException) -> None:
        """Ends the child keeping the grant with this fencing token (a
        session's keepalive listed it as lost), now or when it is adopted."""
        with self._cond:
            if token not in self._lost:
                self._lost[token] = err
                while len(self._lost) > MAX_LOST_REMEMBERED:
                    self._lost.popitem(last=False)
            children = [c for c in self._children if c.token == token]
        for c in children:
            if c.end(err):
                log.warning("dlock: %s lost: %s", c.what, err)

    def _disown(self, child: "Keeper") -> None:
        with self._cond:
            self._children.discard(child)

    def _parent_ended(self, perr: BaseException) -> None:
        if isinstance(perr, errors.LockLost):
            self.end(errors.LockLost(f"{self.what}: its session was lost: {perr}", code=perr.code, body=perr.body))
        else:
            self.end(errors.LockLost(f"{self.what}: its session ended"))

    def join(self) -> None:
        """Waits for the keeper's threads (after end)."""
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def extend(self, sent: float) -> None:
        """Moves the bound after a renewal sent at sent was answered with
        success. A lease that ended stays ended: lost is never cleared."""
        with self._cond:
            if self.error is None and sent > self._sent:
                self._sent = sent
                self._cond.notify_all()

    def _watchdog(self) -> None:
        with self._cond:
            while self.error is None:
                left = self._sent + self.ttl - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self.error is not None:
                return
        if self.end(errors.LockLost(f"{self.what}: no renewal was answered within the TTL ({self.ttl:g} s)")):
            log.warning("dlock: %s lost: no renewal was answered within the TTL", self.what)

    def _keep_alive(self) -> None:
        assert self._renew is not None
        retry_at: Optional[float] = None
        while True:
            with self._cond:
                while self.error is None:
                    at = retry_at if retry_at is not None else self._sent + self.ttl / 3
                    left = at - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self.error is not None:
                    return
                bound = self._sent + self.ttl
            # A renewal answered after the bound cannot help: by then the
            # lease counts as lost, and it never comes back.
            try:
                sent = self._renew(bound)
            except (errors.NotHolder, errors.SessionExpired, errors.LockLost) as e:
                if self.end(errors.LockLost(f"{self.what} lost: {e}", code=e.code, status=e.status, body=e.body)):
                    log.warning("dlock: %s lost: %s", self.what, e)
                return
            except Exception as e:  # a passing failure: retry until the bound
                if self.lost.is_set():
                    return
                log.debug("dlock: renewing %s failed; retrying until the bound: %s", self.what, e)
                retry_at = time.monotonic() + max(self.ttl / 20, 0.02)
                continue
            self.extend(sent)
            retry_at = None

    def attempt_timeout(self) -> float:
        """Bounds one attempt of a renewal, so that a node that hangs leaves
        time to try another one within the TTL."""
        return min(max(self.ttl / 3, 0.5), self._attempt_timeout)
