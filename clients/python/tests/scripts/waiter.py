"""waiter.py ENDPOINTS LOCK ID: waits in line for LOCK as long as it
takes; prints WAITING, then GRANTED TOKEN once it has it."""
import sys

import dlock

client = dlock.Client(sys.argv[1].split(","), client_id=sys.argv[3])
print("WAITING", flush=True)
with client.lock(sys.argv[2], ttl=10) as lease:
    print("GRANTED", lease.token, flush=True)
print("DONE", flush=True)
