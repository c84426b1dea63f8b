"""Watches: every state change from a revision on, resumed across node
failures without losing or repeating an event."""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Iterator
from urllib.parse import urlencode

from . import errors
from ._sse import Stream

_CURRENT = re.compile(r"current (\d+)")


class Watch:
    """An iterator of watch events (dicts, docs/api.md "Watch"):

        with client.watch("billing/", from_revision=rev + 1) as w:
            for ev in w:
                print(ev["revision"], ev["type"], ev["name"])

    One revision can carry several events (a release and the hand-off it
    causes), and a stream can break between two of them. So a watch resumes
    at the last revision it delivered, not after it, and skips the events of
    that revision it already delivered: every node sends the same events in
    the same order. It ends with Compacted when the revisions to resume from
    are no longer kept (list again), and when closed.
    """

    def __init__(self, client: Any, prefix: str, from_revision: int) -> None:
        if from_revision < 0:
            raise errors.InvalidArgument("from_revision must be 0 (from now) or a revision")
        self.prefix = prefix
        self._from = from_revision  # what the current connection asked for
        self._skip = 0  # events of revision _from to drop on this connection
        self._last = 0  # last revision delivered
        self._last_count = 0  # how many of its events were
        self._start = 0  # where the server said a from-now watch starts
        self._stream = Stream(client._t, "watch", self._path, self._opening, self._rejected)

    def resume_from(self) -> int:
        if self._last > 0:
            return self._last
        if self._from == 0 and self._start > 0:
            # Nothing delivered yet: resume where the first stream started,
            # not at the next node's "now".
            return self._start
        return self._from

    def _path(self) -> str:
        self._from, self._skip = self.resume_from(), 0
        if self._last > 0:
            self._skip = self._last_count
        self._start = 0
        q: Dict[str, str] = {}
        if self.prefix:
            q["prefix"] = self.prefix
        if self._from > 0:
            q["from_revision"] = str(self._from)
        return "/watch" + ("?" + urlencode(q) if q else "")

    def _opening(self, text: str) -> None:
        if self._from != 0 or self._last != 0:
            return
        prefix = "dlock watch from revision "
        if text.startswith(prefix):
            try:
                self._start = int(text[len(prefix):].strip())
            except ValueError:
                pass

    def _rejected(self, err: errors.DlockError) -> BaseException:
        if isinstance(err, errors.Compacted):
            m = _CURRENT.search(err.message)
            e = errors.Compacted(f"watch from revision {self.resume_from()}: {err.message}", code=err.code,
                                 status=err.status, body=err.body)
            e.current = int(m.group(1)) if m else 0  # type: ignore[attr-defined]
            return e
        return err

    def _deliver(self, ev: Dict[str, Any]) -> bool:
        rev = int(ev.get("revision", 0))
        if rev < self._from:
            return False
        if self._skip > 0 and rev == self._from:
            self._skip -= 1
            return False
        self._skip = 0
        if rev == self._last:
            self._last_count += 1
        else:
            self._last, self._last_count = rev, 1
        return True

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for rec in self._stream.records():
            ev = json.loads(rec.data)
            if self._deliver(ev):
                yield ev

    def close(self) -> None:
        """Ends the watch (from any thread); the iteration stops."""
        self._stream.close()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
