"""The client over TLS: a cluster serving HTTPS with a certificate from a
CA of the test's own, trusted through ssl_context."""

import datetime
import ipaddress
import ssl

import pytest

import dlock
from conftest import Cluster


def _ca_and_cert(tmp_path):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dlock test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = {}
    for name, data in [("ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
                       ("cert.pem", cert.public_bytes(serialization.Encoding.PEM)),
                       ("key.pem", key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))]:
        (tmp_path / name).write_bytes(data)
        paths[name] = str(tmp_path / name)
    return paths


def test_locks_and_watches_over_tls(dlock_bin, tmp_path):
    p = _ca_and_cert(tmp_path)
    ctx = ssl.create_default_context(cafile=p["ca.pem"])
    c = Cluster(dlock_bin, 1, extra_args=["--tls-cert", p["cert.pem"], "--tls-key", p["key.pem"]], ssl_context=ctx)
    try:
        # A bare host:port means https once an ssl_context is given.
        client = dlock.Client([n.api for n in c.nodes], client_id="tls-1", ssl_context=ctx)
        _, rev = client.list_locks()
        with client.lock("tls/x", ttl=5) as lease:
            assert lease.token > 0
        with client.watch("tls/", from_revision=rev + 1) as w:
            types = []
            for ev in w:
                types.append(ev["type"])
                if ev["type"] == "released":
                    break
        assert types == ["acquired", "released"]
        # Without the CA the certificate is refused, and nothing gets through.
        untrusting = dlock.Client([n.url for n in c.nodes], client_id="tls-2", retry_timeout=1)
        with pytest.raises(dlock.Unavailable):
            untrusting.get_lock("tls/x")
    finally:
        c.stop()
