"""Python client of dlock, the distributed lock service.

    import dlock
    client = dlock.Client(["http://127.0.0.1:7070", "http://127.0.0.1:7080"])
    with client.lock("billing/job", ttl=30) as lease:
        do_the_work(fencing_token=lease.token)

See README.md beside this package, docs/client.md and docs/api.md.
"""

from .client import Client, Grant, Lease, Session
from .election import Election, Leadership, Observation
from .errors import (ClientClosed, Compacted, DlockError, InvalidArgument, LockHeld, LockLost, NoLeader, NotFound,
                     NotHolder, PermissionDenied, RateLimited, SessionExpired, TooLarge, Unauthenticated, Unavailable,
                     WaitTimeout)
from .watch import Watch

__version__ = "0.1.0"

__all__ = [
    "Client", "Grant", "Lease", "Session", "Election", "Leadership", "Observation", "Watch",
    "DlockError", "InvalidArgument", "NotFound", "LockHeld", "WaitTimeout", "LockLost", "NotHolder",
    "SessionExpired", "Compacted", "Unavailable", "NoLeader", "Unauthenticated", "PermissionDenied",
    "TooLarge", "RateLimited", "ClientClosed",
]
