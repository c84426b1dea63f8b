"""Fencing for resources written outside Go: verify a grant's token proof
against the cluster's published keys, and keep the highest token per key.

The same rules as the Go ``fence`` package (docs/fencing.md):

    keys = fence.KeySet.fetch("http://127.0.0.1:7070")      # GET /api/v1/cluster/token-key
    checker = fence.Checker("/var/lib/myservice/fence.db")   # or Checker() in memory

    # for every write that arrives with a grant:
    keys.verify(lock, token, client_id, lease_ref, proof)    # raises BadProof (a FenceError)
    checker.check(lock, token, client_id + "/" + lease_ref)  # raises StaleToken
    ... do the write, under the same lock as the check ...

Verifying needs Ed25519 from the ``cryptography`` package (Debian:
python3-cryptography); everything else is the standard library.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sqlite3
import ssl
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, List, Mapping, Optional, Tuple

PROOF_PREFIX = b"dlock-fence-v1"
LEASE_REF_PREFIX = b"dlock-lease-ref-v1"
KEY_ID_LEN = 8
PROOF_LEN = KEY_ID_LEN + 64
#: Length of a proof string: unpadded base64url of 72 bytes.
PROOF_ENCODED_LEN = 96
TOKEN_KEY_PATH = "/api/v1/cluster/token-key"
ALGORITHM = "ed25519"
MAX_KEY_LEN = MAX_HOLDER_LEN = 1024
_MAX_KEYSET_BYTES = 1 << 20
_U64 = (1 << 64) - 1
_PROOF_RE = re.compile(r"^[A-Za-z0-9_-]{96}$")


class FenceError(Exception):
    """Base of the errors of this module."""


class BadProof(FenceError):
    """The token proof does not prove the grant (answer 403)."""


class ProofMalformed(BadProof):
    """The proof is not 96 characters of unpadded base64url. Send the
    token_proof string exactly as the cluster returned it with the grant."""


class UnknownKey(BadProof):
    """The proof is signed by a key this resource does not trust. Refresh
    the key set (GET /api/v1/cluster/token-key); if it persists, the proof
    comes from another cluster."""


class BadSignature(BadProof):
    """The proof does not match this lock, token, client and lease: it was
    made for another grant, or forged."""


class TokenAboveKeyBound(BadProof):
    """Signed by a retired key for a token above the last one that key can
    have signed: forged with a leaked, rotated-away key."""


class StaleToken(FenceError):
    """A higher token (or this token from another holder) was already
    accepted for the key: the writer lost its lock and must stop."""

    def __init__(self, key: str, token: int, highest: int) -> None:
        self.key, self.token, self.highest = key, token, highest
        if token == highest:
            msg = (f"fence: token {token} for {key!r} was already used by another holder; "
                   "this writer does not hold the lock: stop and acquire it again")
        else:
            msg = (f"fence: token {token} for {key!r} is stale: token {highest} was already accepted, "
                   "so this writer has lost the lock: stop and acquire it again")
        super().__init__(msg)


class InvalidCheck(FenceError, ValueError):
    """A bad argument to Checker.check (token 0, empty or over-long key or
    holder). Nothing was recorded."""


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _lp(s: str) -> bytes:
    b = s.encode("utf-8")
    return _uvarint(len(b)) + b


def proof_message(lock: str, token: int, client_id: str, lease_ref: str) -> bytes:
    """The bytes a token proof signs (docs/fencing.md, "Token proof format"):
    "dlock-fence-v1", then lock, token (8 bytes big-endian), client_id and
    lease_ref, each string preceded by its length as an unsigned varint."""
    if not 0 <= token <= _U64:
        raise ValueError("token must be 0 to 2^64-1")
    return PROOF_PREFIX + _lp(lock) + token.to_bytes(8, "big") + _lp(client_id) + _lp(lease_ref)


def lease_ref(lease_id: str) -> str:
    """The public reference to a lease that proofs bind: the first 16 bytes,
    in hex, of SHA-256 of "dlock-lease-ref-v1", a zero byte and the lowercase
    lease id. (The cluster returns it with every grant as lease_ref.)"""
    return hashlib.sha256(LEASE_REF_PREFIX + b"\x00" + lease_id.lower().encode()).hexdigest()[:32]


def key_id(public_key: bytes) -> str:
    """A signing key's id: the first 8 bytes of SHA-256 of its 32-byte
    Ed25519 public key, as 16 hex digits."""
    return hashlib.sha256(public_key).digest()[:KEY_ID_LEN].hex()


class _Key:
    __slots__ = ("pub", "max_token")

    def __init__(self, pub: bytes, max_token: Optional[int]) -> None:
        self.pub = pub
        self.max_token = max_token


class KeySet:
    """An immutable set of trusted public keys, each with an optional bound
    (a retired key's max_token). Replace the whole set to follow a rotation;
    refresh it regularly and keep the old one if a refresh fails."""

    def __init__(self, keys: Mapping[str, _Key]) -> None:
        self._keys = dict(keys)

    @classmethod
    def from_public_keys(cls, *pubs: bytes) -> "KeySet":
        """Trusts exactly these raw 32-byte keys, for any token (pinned keys:
        no retired-key bounds). Keys of another length are skipped."""
        return cls({key_id(p): _Key(bytes(p), None) for p in pubs if len(p) == 32})

    @classmethod
    def from_document(cls, doc: Any) -> "KeySet":
        """Trusts the keys of a key-set document ({"keys": [...]}), each
        within its max_token. One bad entry rejects the whole document: a
        partly understood key set is a sign of a misconfigured or tampered
        source. Unknown fields are ignored."""
        keys = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(keys, list) or not keys:
            raise FenceError('fence: key set has no keys; the document must be {"keys":[{"id","algorithm","public_key","current"}...]}')
        out: Dict[str, _Key] = {}
        for i, k in enumerate(keys):
            try:
                kid, key = _parse_key(k)
            except FenceError as e:
                raise FenceError(f"fence: key set entry {i}: {e}") from None
            if kid in out:
                raise FenceError(f"fence: key set entry {i}: key {kid} is listed twice")
            out[kid] = key
        return cls(out)

    @classmethod
    def parse(cls, data: "bytes | str") -> "KeySet":
        """Reads the JSON key-set document (the body of GET /api/v1/cluster/token-key)."""
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise FenceError(f"fence: key set is not a JSON key-set document: {e}") from None
        return cls.from_document(doc)

    @classmethod
    def fetch(cls, base_url: str, *, timeout: float = 10.0, ssl_context: Optional[ssl.SSLContext] = None,
              token: str = "") -> "KeySet":
        """Gets the key set from a dlock node ("http://127.0.0.1:7070"). Fetch
        over TLS or from a trusted network: whoever answers decides which
        proofs the resource accepts."""
        url = base_url.rstrip("/") + TOKEN_KEY_PATH
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        if token:
            req.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=ssl_context) as res:
                body = res.read(_MAX_KEYSET_BYTES + 1)
        except urllib.error.HTTPError as e:
            raise FenceError(f"fence: GET {url}: {e.code}: {e.read(300)!r}") from None
        except OSError as e:
            raise FenceError(f"fence: fetch key set: {e} (is a dlock node serving at {base_url}?)") from None
        if len(body) > _MAX_KEYSET_BYTES:
            raise FenceError(f"fence: key set from {url} is over {_MAX_KEYSET_BYTES} bytes; that is not a key-set document")
        return cls.parse(body)

    def ids(self) -> List[str]:
        return sorted(self._keys)

    def max_token(self, kid: str) -> Optional[int]:
        """The highest token the key verifies; None for a key that verifies
        any token (the current key) or that is not in the set."""
        k = self._keys.get(kid)
        return None if k is None else k.max_token

    def verify(self, lock: str, token: int, client_id: str, lease_ref: str, proof: str) -> None:
        """Checks that proof was signed by a key in the set for exactly this
        lock, token, client and lease, and that the token is within the key's
        bound. Raises ProofMalformed, UnknownKey, BadSignature or
        TokenAboveKeyBound (all BadProof)."""
        if not isinstance(proof, str) or len(proof) != PROOF_ENCODED_LEN:
            n = len(proof) if isinstance(proof, str) else 0
            raise ProofMalformed(f"fence: token proof is malformed: it is {n} characters, a proof is {PROOF_ENCODED_LEN}")
        if not _PROOF_RE.match(proof):
            raise ProofMalformed("fence: token proof is malformed: not unpadded base64url")
        raw = base64.urlsafe_b64decode(proof)
        kid = raw[:KEY_ID_LEN].hex()
        k = self._keys.get(kid)
        if k is None:
            raise UnknownKey(f"fence: token proof is signed by a key this resource does not trust: key id {kid} "
                             "(refresh the key set from the cluster's GET /api/v1/cluster/token-key)")
        if not 0 < token <= _U64:
            raise BadSignature(f"fence: token {token} is not a fencing token")
        try:
            from cryptography.exceptions import InvalidSignature
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError as e:  # pragma: no cover - depends on the system
            raise FenceError("fence: verifying proofs needs the cryptography package (Debian: apt-get install "
                             "python3-cryptography; pip: pip install cryptography)") from e
        try:
            Ed25519PublicKey.from_public_bytes(k.pub).verify(raw[KEY_ID_LEN:], proof_message(lock, token, client_id, lease_ref))
        except InvalidSignature:
            raise BadSignature(f"fence: token proof does not match lock {lock!r}, token {token}, client {client_id!r} "
                               f"(key {kid}): it was made for another grant, or forged") from None
        # After the signature, so this always means "signed by the key, yet
        # beyond what it can have signed".
        if k.max_token is not None and token > k.max_token:
            raise TokenAboveKeyBound(f"fence: token proof for lock {lock!r}, token {token} is signed by key {kid}, "
                                     f"retired at token {k.max_token}: forged with a leaked, rotated-away key")


def _parse_key(k: Any) -> Tuple[str, _Key]:
    if not isinstance(k, dict):
        raise FenceError("not an object")
    if k.get("algorithm") != ALGORITHM:
        raise FenceError(f"algorithm {k.get('algorithm')!r} is not supported (only {ALGORITHM!r}); upgrade this resource's dlock package")
    try:
        raw = base64.b64decode(str(k.get("public_key", "")), validate=True)
    except ValueError as e:
        raise FenceError(f"public_key is not standard base64: {e}") from None
    if len(raw) != 32:
        raise FenceError(f"public_key is {len(raw)} bytes; an Ed25519 key is 32")
    kid = k.get("id")
    if not isinstance(kid, str) or not re.fullmatch(r"[0-9a-fA-F]{16}", kid):
        raise FenceError(f"key id {kid!r} is not 16 hex digits")
    kid = kid.lower()
    if kid != key_id(raw):
        raise FenceError(f"id {kid} does not match its public key (whose id is {key_id(raw)}); the document is corrupt")
    mt = k.get("max_token")
    if mt is not None:
        if isinstance(mt, bool) or not isinstance(mt, int) or not 0 <= mt <= _U64:
            raise FenceError(f"max_token {mt!r} is not an integer from 0 to 2^64-1")
        if k.get("current"):
            raise FenceError(f"key {kid} is current but has max_token {mt}; only retired keys are bounded, so the document is corrupt")
    return kid, _Key(raw, mt)


class Checker:
    """Remembers, per key, the highest fencing token accepted and the holder
    that wrote with it.

    With a path it keeps them in an SQLite file (the standard library's
    sqlite3), synced to disk before check() returns, so a restart never
    forgets; without one, in memory. check() is one transaction: safe from
    many threads, and from several processes sharing the file.
    """

    def __init__(self, path: Optional[str] = None, *, timeout: float = 5.0) -> None:
        self._mu = threading.Lock()
        self._db = sqlite3.connect(path or ":memory:", timeout=timeout, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA synchronous=FULL")
        # token: 8 bytes big-endian (SQLite integers stop at 2^63-1).
        self._db.execute("CREATE TABLE IF NOT EXISTS fence_highest (key TEXT PRIMARY KEY, token BLOB NOT NULL, holder TEXT NOT NULL)")

    def close(self) -> None:
        with self._mu:
            self._db.close()

    def __enter__(self) -> "Checker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def check(self, key: str, token: int, holder: str) -> None:
        """Decides whether a write with token by holder may go ahead for key:

        - token above the highest seen for key (or none seen): accepted and
          recorded;
        - token equal to the highest, same holder: accepted (the same grant
          writing again);
        - otherwise StaleToken, and nothing changes.

        holder should name the grant, e.g. client_id + "/" + lease_ref. Token
        0, an empty key or holder, or one over 1024 bytes: InvalidCheck.
        """
        if isinstance(token, bool) or not isinstance(token, int) or not 0 < token <= _U64:
            raise InvalidCheck(f"fence: token {token!r} is not a fencing token (tokens start at 1)")
        if not key or len(key.encode()) > MAX_KEY_LEN:
            raise InvalidCheck(f"fence: key must be 1 to {MAX_KEY_LEN} bytes")
        if not holder or len(holder.encode()) > MAX_HOLDER_LEN:
            raise InvalidCheck(f"fence: holder must be 1 to {MAX_HOLDER_LEN} bytes")
        with self._mu:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT token, holder FROM fence_highest WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    highest = int.from_bytes(row[0], "big")
                    if token < highest or (token == highest and holder != row[1]):
                        raise StaleToken(key, token, highest)
                    if token == highest:
                        db.execute("COMMIT")
                        return
                db.execute("INSERT OR REPLACE INTO fence_highest (key, token, holder) VALUES (?, ?, ?)",
                           (key, token.to_bytes(8, "big"), holder))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    def highest(self, key: str) -> Optional[Tuple[int, str]]:
        """The highest token accepted for key and its holder, or None."""
        with self._mu:
            row = self._db.execute("SELECT token, holder FROM fence_highest WHERE key = ?", (key,)).fetchone()
        return None if row is None else (int.from_bytes(row[0], "big"), row[1])
