"""Certificates made in the test run (trustme): a CA, the broker's certificate
for 127.0.0.1, client certificates for mutual TLS, and an untrusted CA."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from broker.tls import client_context


@dataclass(frozen=True)
class Pki:
    """Files of one test's certificates."""

    ca: Path
    server_cert: Path
    server_key: Path
    #: A client certificate (common name "alice") and its key, in one PEM file.
    alice: Path
    #: A client certificate signed by a CA the broker does not trust.
    mallory: Path
    #: A CA nobody uses (a client trusting only it cannot verify the broker).
    other_ca: Path

    def client(self, certificate: Path | None = None) -> ssl.SSLContext:
        """A client context that trusts the test CA (and presents ``certificate``)."""
        return client_context(str(self.ca), str(certificate) if certificate else None)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    other = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    alice = ca.issue_cert("alice@example.test", common_name="alice")
    mallory = other.issue_cert("mallory@example.test", common_name="alice")
    paths = {name: root / f"{name}.pem" for name in ("ca", "cert", "key", "alice", "mallory")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    alice.private_key_and_cert_chain_pem.write_to_path(str(paths["alice"]))
    mallory.private_key_and_cert_chain_pem.write_to_path(str(paths["mallory"]))
    other_ca = root / "other-ca.pem"
    other.cert_pem.write_to_path(str(other_ca))
    return Pki(paths["ca"], paths["cert"], paths["key"], paths["alice"], paths["mallory"], other_ca)
