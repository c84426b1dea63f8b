"""dlock.fence: the proof format, key sets, the checker (no cluster), and
proofs made by a real cluster (test_cluster.py)."""

import base64
import os
import threading

import pytest

from dlock import fence

# The published vector of docs/fencing.md ("A test vector"); the Go fence
# package's TestPublishedVector checks the same.
VECTOR_PUB = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg="
VECTOR_ID = "56475aa75463474c"
VECTOR_PROOF = "Vkdap1RjR0wNeeSlzrJzqRx_9ulRd08LoVKdnKaKovZj7tfCK37tvnm7DB2SxGrftbhOO6Z2ME4FLXqrP-GOD5W94L7vWHsJ"
REF = "613a8c7ef20a468cbc4f6a649c173f8e"


def vector_keys(**extra):
    return fence.KeySet.from_document({"keys": [dict({"id": VECTOR_ID, "algorithm": "ed25519", "public_key": VECTOR_PUB,
                                                      "current": True}, **extra)]})


def test_message_and_lease_ref_byte_for_byte():
    assert fence.lease_ref("0123456789ABCDEF0123456789abcdef") == REF
    msg = fence.proof_message("billing/job", 42, "worker-7", REF)
    assert msg.hex() == ("646c6f636b2d66656e63652d76310b62696c6c696e672f6a6f62000000000000002a08776f726b65722d3720"
                         "3631336138633765663230613436386362633466366136343963313733663865")
    # Lengths over 127 take two varint bytes.
    assert fence.proof_message("x" * 300, 1, "c", "r")[14:16] == bytes([0xAC, 0x02])
    assert fence.key_id(base64.b64decode(VECTOR_PUB)) == VECTOR_ID


def test_published_vector_verifies_and_binds_every_field():
    pytest.importorskip("cryptography")
    ks = vector_keys()
    ks.verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF)
    for args in [("billing/job", 43, "worker-7", REF), ("billing/jo", 42, "worker-7", REF),
                 ("billing/job", 42, "worker-8", REF), ("billing/job", 42, "worker-7", "0" * 32)]:
        with pytest.raises(fence.BadSignature):
            ks.verify(*args, VECTOR_PROOF)
    with pytest.raises(fence.ProofMalformed):
        ks.verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF[:-1])
    with pytest.raises(fence.ProofMalformed):
        ks.verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF[:-1] + "=")
    with pytest.raises(fence.UnknownKey):
        fence.KeySet.from_public_keys(os.urandom(32)).verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF)
    # A retired key verifies only up to its bound.
    bounded = vector_keys(current=False, max_token=41)
    with pytest.raises(fence.TokenAboveKeyBound):
        bounded.verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF)
    vector_keys(current=False, max_token=42).verify("billing/job", 42, "worker-7", REF, VECTOR_PROOF)


def test_key_set_documents_are_checked_whole():
    good = {"id": VECTOR_ID, "algorithm": "ed25519", "public_key": VECTOR_PUB, "current": True}
    for bad in [{"keys": []}, {"keys": [dict(good, algorithm="rsa")]}, {"keys": [dict(good, id="0" * 16)]},
                {"keys": [dict(good, public_key="AAAA")]}, {"keys": [good, good]},
                {"keys": [dict(good, max_token=5)]}, {"keys": [dict(good, current=False, max_token=-1)]},
                {"keys": [dict(good, current=False, max_token=True)]}]:
        with pytest.raises(fence.FenceError):
            fence.KeySet.from_document(bad)
    ks = fence.KeySet.parse('{"keys":[' + __import__("json").dumps(dict(good, future_field=1)) + "]}")
    assert ks.ids() == [VECTOR_ID] and ks.max_token(VECTOR_ID) is None


def test_checker_rules(tmp_path):
    path = str(tmp_path / "fence.db")
    with fence.Checker(path) as c:
        c.check("k", 5, "a")
        c.check("k", 5, "a")  # the same grant writing again
        with pytest.raises(fence.StaleToken) as e:
            c.check("k", 5, "b")
        assert e.value.highest == 5
        with pytest.raises(fence.StaleToken):
            c.check("k", 4, "a")
        c.check("k", 6, "b")
        c.check("k", 2 ** 64 - 1, "c")
        for bad in [("k", 0, "a"), ("", 1, "a"), ("k", 1, ""), ("k" * 1025, 1, "a"), ("k", 2 ** 64, "a")]:
            with pytest.raises(fence.InvalidCheck):
                c.check(*bad)
    # A reopened checker remembers.
    with fence.Checker(path) as c:
        assert c.highest("k") == (2 ** 64 - 1, "c")
        with pytest.raises(fence.StaleToken):
            c.check("k", 7, "d")
        assert c.highest("nothing") is None


def test_checker_decides_concurrent_checks_one_at_a_time(tmp_path):
    c = fence.Checker(str(tmp_path / "f.db"))
    accepted, refused = [], []
    mu = threading.Lock()

    def writer(tok):
        try:
            c.check("k", tok, f"h{tok}")
            out = accepted
        except fence.StaleToken:
            out = refused
        with mu:
            out.append(tok)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(1, 41)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Whatever the order: the highest accepted is what the checker keeps, and
    # a token was refused only because a higher one had been accepted.
    assert len(accepted) + len(refused) == 40 and 40 in accepted
    assert c.highest("k") == (40, "h40")
    assert all(t < max(accepted) for t in refused)
    c.close()
