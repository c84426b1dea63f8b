"""interrupted.py ENDPOINTS LOCK ID: waits in line for LOCK until Ctrl-C
(SIGINT), then prints INTERRUPTED: the wait must be withdrawn."""
import sys

import dlock

client = dlock.Client(sys.argv[1].split(","), client_id=sys.argv[3])
print("WAITING", flush=True)
try:
    client.lock(sys.argv[2], ttl=10)
    print("GRANTED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
