"""holder.py ENDPOINTS LOCK ID: holds LOCK (TTL 10 s, renewed) until told
"release" on stdin; prints GRANTED TOKEN, then DONE LOST."""
import sys

import dlock

client = dlock.Client(sys.argv[1].split(","), client_id=sys.argv[3])
with client.lock(sys.argv[2], ttl=10) as lease:
    print("GRANTED", lease.token, flush=True)
    sys.stdin.readline()
    lost = lease.lost.is_set()
print("DONE", lost, flush=True)
