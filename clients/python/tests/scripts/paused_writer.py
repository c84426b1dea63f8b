"""paused_writer.py ENDPOINTS LOCK ID DATASTORE: takes LOCK with a 2 s TTL
and prints GRANTED TOKEN LEASE_REF PROOF; then (frozen by the test with
SIGSTOP, and thawed) waits for "write" on stdin, reports whether the lease
was lost, and writes to the fenced data store with its token anyway,
printing LOST flag and WROTE status."""
import json
import sys
import urllib.error
import urllib.request

import dlock

endpoints, name, me, store = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
client = dlock.Client(endpoints, client_id=me)
lease = client.acquire(name, ttl=2)
print("GRANTED", lease.token, lease.lease_ref, lease.token_proof, flush=True)
sys.stdin.readline()
# After a pause past the TTL the watchdog sets lost as soon as it runs.
print("LOST", lease.lost.wait(10), type(lease.error).__name__, flush=True)
body = json.dumps({"client_id": me, "lock": name, "fencing_token": lease.token, "lease_ref": lease.lease_ref,
                   "token_proof": lease.token_proof, "data": "late write"}).encode()
req = urllib.request.Request(store + "/write", data=body, headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        status = r.status
except urllib.error.HTTPError as e:
    status = e.code
print("WROTE", status, flush=True)
try:
    lease.release()
except dlock.LockLost:
    pass
