"""Server-Sent Events streams (watch, observe), resumed on another node
when one breaks."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
from typing import Any, Callable, Iterator, Optional

from . import errors
from ._transport import BACKOFF_MAX, BACKOFF_MIN, NotSent, Transport, jitter

log = logging.getLogger("dlock")

#: How long a stream may stay silent before it counts as broken: the server
#: sends a heartbeat every 15 s.
STREAM_IDLE = 45.0
MAX_LINE = 1 << 20


class Record:
    __slots__ = ("id", "event", "data")

    def __init__(self) -> None:
        self.id = ""
        self.event = ""
        self.data = ""


class Stream:
    """Follows one stream: ``path()`` says where to (re)connect, each record
    is yielded by ``records()``; ``rejected`` maps an answer that retrying
    cannot fix to the final error. close() from any thread ends it."""

    def __init__(self, t: Transport, what: str, path: Callable[[], str],
                 comment: Optional[Callable[[str], None]] = None,
                 rejected: Optional[Callable[[errors.DlockError], BaseException]] = None) -> None:
        self._t = t
        self.what = what
        self._path = path
        self._comment = comment
        self._rejected = rejected
        self._closed = threading.Event()
        self._mu = threading.Lock()
        self._conn: Optional[http.client.HTTPConnection] = None

    def close(self) -> None:
        self._closed.set()
        with self._mu:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def records(self) -> Iterator[Record]:
        backoff = BACKOFF_MIN
        while not self._closed.is_set():
            self._t.discover()
            base, wait = self._t.target()
            if wait > 0:
                self._closed.wait(wait)
                continue
            progressed = False
            try:
                for rec in self._read(base):
                    progressed = True
                    yield rec
                if self._closed.is_set():
                    return
                err: Any = "the stream ended"
                self._t.failed(base)
            except _Final as f:
                raise f.err from None
            except NotSent as e:
                err = e
                self._t.failed(base, undialable=True)
            except (OSError, http.client.HTTPException, errors.DlockError) as e:
                if self._closed.is_set():
                    return
                err = e
                self._t.failed(base, getattr(e, "retry_after", 0.0))
            if progressed:
                backoff = BACKOFF_MIN
            log.debug("dlock: %s: stream from %s broke; resuming on another node: %s", self.what, base, err)
            self._closed.wait(jitter(backoff))
            backoff = min(2 * backoff, BACKOFF_MAX)

    def _read(self, base: str) -> Iterator[Record]:
        conn = self._t.connect(base, self._t.request_timeout)
        with self._mu:
            self._conn = conn
        try:
            try:
                conn.connect()
            except OSError as e:
                raise NotSent(f"{base}: {e}") from e
            if self._closed.is_set():
                return
            conn.request("GET", "/api/v1" + self._path(), headers=self._t.headers(accept="text/event-stream"))
            res = conn.getresponse()
            if res.status != 200:
                data = res.read(1 << 20)
                try:
                    parsed = json.loads(data)
                except ValueError:
                    parsed = None
                err = errors.from_answer(res.status, parsed, data.decode("utf-8", "replace"))
                if res.status in (429, 502, 503, 504):
                    ra = res.getheader("Retry-After", "")
                    err.retry_after = float(ra) if ra.isdigit() else 0.0  # type: ignore[attr-defined]
                    raise err
                raise _Final(self._rejected(err) if self._rejected else err)
            if conn.sock is not None:
                conn.sock.settimeout(STREAM_IDLE)
            rec = Record()
            has_data = False
            while True:
                raw = res.readline(MAX_LINE)
                if not raw:
                    return
                line = raw.decode("utf-8").rstrip("\r\n")
                if line == "":
                    if not rec.event and not has_data:
                        continue
                    if rec.event == "error":
                        try:
                            parsed = json.loads(rec.data)
                        except ValueError:
                            parsed = None
                        err = errors.from_answer(0, parsed, rec.data)
                        if isinstance(err, errors.Compacted):
                            raise _Final(self._rejected(err) if self._rejected else err)
                        # Cut off (slow watcher, node shutting down): resume.
                        raise err
                    yield rec
                    rec, has_data = Record(), False
                    continue
                if line.startswith(":"):
                    if self._comment is not None:
                        self._comment(line[1:].strip())
                    continue
                field, _, value = line.partition(":")
                if value.startswith(" "):
                    value = value[1:]
                if field == "event":
                    rec.event = value
                elif field == "id":
                    rec.id = value
                elif field == "data":
                    rec.data = rec.data + "\n" + value if has_data else value
                    has_data = True
        finally:
            with self._mu:
                self._conn = None
            conn.close()


class _Final(Exception):
    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err
