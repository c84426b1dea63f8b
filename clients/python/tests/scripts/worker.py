"""worker.py ENDPOINTS LOCK LOGFILE N ID: takes LOCK N times, each time
appending "start ID TOKEN" and "end ID TOKEN" to LOGFILE around a short
critical section."""
import os
import random
import sys
import time

import dlock

endpoints, name, path, n, me = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
client = dlock.Client(endpoints, client_id=me)


def append(line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


for _ in range(n):
    with client.lock(name, ttl=5) as lease:
        append(f"start {me} {lease.token}")
        time.sleep(random.uniform(0, 0.02))
        lease.check()  # still ours
        append(f"end {me} {lease.token}")
print("DONE", flush=True)
