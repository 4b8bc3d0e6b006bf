"""TLS on the MQTT listener: when the broker serves TLS (``tls_cert``,
``tls_key``), MQTT clients are served over TLS with the same certificate;
paho (3.1.1 and 5.0) and mosquitto_pub connect with the test CA; a plain
TCP client is refused cleanly and counted. Certificates come from trustme."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import trio
import trustme

from tests.server.helpers import wait_until

from .listener_helpers import (
    HANG_GUARD,
    V5,
    VERSIONS,
    PahoClient,
    RawMQTT,
    mqtt_broker,
    mqtt_port,
    paho_client,
    require_mosquitto_clients,
)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The test CA, and the broker's certificate (127.0.0.1) and key."""
    root = tmp_path_factory.mktemp("mqtt-pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    paths = root / "ca.pem", root / "cert.pem", root / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    server.cert_chain_pems[0].write_to_path(str(paths[1]))
    server.private_key_pem.write_to_path(str(paths[2]))
    return paths


@VERSIONS
async def test_paho_publishes_and_subscribes_over_tls(
    version: int, certificates: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = certificates
    async with mqtt_broker(tls_cert=str(cert), tls_key=str(key)) as broker:
        assert broker.mqtt is not None and broker.mqtt.ssl_context is not None
        port = mqtt_port(broker)

        def secure(client: paho.Client) -> None:
            client.tls_set(ca_certs=str(ca), tls_version=ssl.PROTOCOL_TLS_CLIENT)

        async with (
            paho_client(port, version=version, configure=secure) as reader,
            paho_client(port, version=version, configure=secure) as writer,
        ):
            await reader.subscribe("secure/+", qos=1)
            for index in range(5):
                await writer.publish(f"secure/{index}", b"secret %d" % index, qos=1)
            got = await reader.receive(5)
        assert [m.payload for m in got] == [b"secret %d" % i for i in range(5)]
        assert broker.security.tls_handshake_failures == 0


async def test_mosquitto_pub_over_tls(certificates: tuple[Path, Path, Path]) -> None:
    pub, sub = require_mosquitto_clients()
    ca, cert, key = certificates
    async with mqtt_broker(tls_cert=str(cert), tls_key=str(key)) as broker:
        port = str(mqtt_port(broker))
        with trio.fail_after(HANG_GUARD):
            await trio.run_process(
                [pub, "-h", "127.0.0.1", "-p", port, "--cafile", str(ca), "-q", "1", "-r",
                 "-t", "tls/pub", "-m", "over tls"],
                capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
            result = await trio.run_process(
                [sub, "-h", "127.0.0.1", "-p", port, "--cafile", str(ca), "-t", "tls/pub",
                 "-C", "1", "-v"],
                capture_stdout=True, capture_stderr=True,
            )  # fmt: skip
    assert result.stdout.decode().strip() == "tls/pub over tls"


async def test_a_plain_client_is_refused_and_counted(certificates: tuple[Path, Path, Path]) -> None:
    _, cert, key = certificates
    async with mqtt_broker(tls_cert=str(cert), tls_key=str(key)) as broker:
        raw = RawMQTT(mqtt_port(broker))
        try:
            # A 3.1.1 CONNECT in plain TCP: no TLS handshake, closed.
            raw.send(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
            await trio.to_thread.run_sync(raw.read_all)
        finally:
            raw.close()
        await wait_until(lambda: broker.security.tls_handshake_failures == 1, what="counted")
        assert broker.mqtt is not None and not broker.mqtt.connections


IDENTITY_AUTH = """
[principals.sensor]
identities = ["alice"]
publish = ["sensors.*"]
subscribe = ["sensors.*"]
"""


async def test_a_client_certificate_is_its_principal(tmp_path: Path) -> None:
    """Over mutual TLS, a CONNECT without a password is the principal whose
    identity is its certificate's common name; a certificate no principal
    names is refused 0x87."""
    ca = trustme.CA()
    issued = {
        "cert": ca.issue_cert("127.0.0.1", "localhost"),
        "alice": ca.issue_cert("alice@example.test", common_name="alice"),
        "bob": ca.issue_cert("bob@example.test", common_name="bob"),
    }
    paths = {name: tmp_path / f"{name}.pem" for name in (*issued, "key", "ca")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    issued["cert"].cert_chain_pems[0].write_to_path(str(paths["cert"]))
    issued["cert"].private_key_pem.write_to_path(str(paths["key"]))
    for name in ("alice", "bob"):
        issued[name].private_key_and_cert_chain_pem.write_to_path(str(paths[name]))
    auth = tmp_path / "auth.toml"
    auth.write_text(IDENTITY_AUTH)

    def certified(name: str) -> Callable[[paho.Client], None]:
        def configure(client: paho.Client) -> None:
            client.tls_set(
                ca_certs=str(paths["ca"]),
                certfile=str(paths[name]),
                tls_version=ssl.PROTOCOL_TLS_CLIENT,
            )

        return configure

    settings = {"tls_cert": str(paths["cert"]), "tls_key": str(paths["key"])}
    settings |= {"tls_client_ca": str(paths["ca"]), "auth_file": str(auth)}
    async with mqtt_broker(auth_failure_delay=0.0, **settings) as broker:
        port = mqtt_port(broker)
        stranger = PahoClient(port, version=V5, configure=certified("bob"))
        reason = await stranger.connect()
        await stranger.close()
        assert int(getattr(reason, "value", reason)) == 0x87
        async with paho_client(port, version=V5, configure=certified("alice")) as sensor:
            assert broker.mqtt is not None
            (connection,) = broker.mqtt.connections.values()
            assert connection.admission.principal_name == "sensor"
            await sensor.subscribe("sensors/+", qos=1)
            await sensor.publish("sensors/t", b"signed", qos=1)
            assert [m.payload for m in await sensor.receive(1)] == [b"signed"]
