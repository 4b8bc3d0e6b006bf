"""``broker bench peers``: the broker beside Mosquitto in one run. Its
figures are checked for shape and sanity (every message arrived,
percentiles positive and ordered), never for speed."""

from __future__ import annotations

import json

import pytest
import trio

from broker.bench import _mqtt as mqtt
from broker.bench import peers
from broker.bench._relay import RelayTable
from broker.bench._trio_floor import _Relay
from broker.cli import main
from broker.cli._bench import DEFAULT_SUITES
from tests.cli.test_cli import run_broker
from tests.deploy.helpers import missing_tool


def test_without_mosquitto_the_suite_says_what_to_install_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peers, "mosquitto_path", lambda: None)
    assert main(["bench", "peers", "--quick", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "broker bench peers: needs mosquitto, which is not installed " + (
        "(apt install mosquitto)\n"
    )


def test_bench_without_a_suite_leaves_peers_out() -> None:
    """``broker bench`` alone runs what needs no other software."""
    assert "peers" not in DEFAULT_SUITES
    assert {"actors", "protocol", "broker"} <= set(DEFAULT_SUITES)


@pytest.mark.slow
def test_peers_measures_both_brokers_at_every_rate() -> None:
    if peers.mosquitto_path() is None:
        missing_tool("mosquitto", "apt install mosquitto")
    result = run_broker("bench", "peers", "--quick", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)["peers"]
    assert figures["python_loop_10m_s"] > 0
    floors = ("trio_floor", "python_floor")
    for rate in peers.TABLE_RATES:
        for name in ("ours", "ours_client", "mosquitto_qos1", "mosquitto_qos0", *floors):
            prefix = f"{name}_rate_{rate}_"
            assert figures[prefix + "received"] == rate * figures["duration_s"], (prefix, figures)
            assert 0 < figures[prefix + "p50_us"] <= figures[prefix + "p99_us"], (prefix, figures)
            assert figures[prefix + "broker_cpu_us_per_msg"] >= 0, (prefix, figures)
        for short in ("qos1", "qos0", "floor", "pyfloor"):
            for ratio in ("p50", "p99"):
                assert figures[f"ratio_{short}_rate_{rate}_{ratio}"] > 0, figures
    # The table shows a row per rate and broker.
    lines = peers.table(figures)
    assert len(lines) == 2 + 6 * len(peers.TABLE_RATES)
    assert "ours client" in lines[2]
    assert "mosquitto qos1" in lines[3]
    assert "trio floor" in lines[5]
    assert "python floor" in lines[6]


async def _relay_exchange(port: int) -> None:
    """Against a floor relay on ``port``: CONNACK, SUBACK, the PUBLISH
    forwarded to the subscriber, PUBACK to the publisher."""
    clients = []
    for name in ("sub", "pub"):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(mqtt.connect(name))
        clients.append((stream, mqtt.PacketReader()))

    async def packet(index: int) -> mqtt.Packet:
        stream, reader = clients[index]
        while not (packets := reader.feed(await stream.receive_some(4096))):
            pass
        return packets[0]

    assert mqtt.parse_connack(await packet(0)) == 0
    assert mqtt.parse_connack(await packet(1)) == 0
    await clients[0][0].send_all(mqtt.subscribe(7, "t", 1))
    assert mqtt.parse_suback(await packet(0)) == (7, [1])
    await clients[1][0].send_all(mqtt.publish("t", b"hello", 1, 42))
    delivered = mqtt.parse_publish(await packet(0))
    assert (delivered.topic, delivered.payload, delivered.qos) == ("t", b"hello", 1)
    assert mqtt.parse_puback(await packet(1)) == 42
    for stream, _reader in clients:
        await stream.aclose()


async def test_the_trio_floor_relays_a_publish_and_acknowledges_it() -> None:
    relay = _Relay()
    # (A relay that answered nothing would otherwise hang the test.)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, relay.serve, 0)
            await _relay_exchange(listeners[0].socket.getsockname()[1])
            nursery.cancel_scope.cancel()


async def test_the_python_floor_relays_a_publish_and_acknowledges_it() -> None:
    with peers.floor_process("_python_floor") as (url, _process), trio.fail_after(30):
        await _relay_exchange(int(url.rsplit(":", 1)[1]))


def test_the_relay_rule_forwards_at_the_publishers_qos_and_forgets_the_gone() -> None:
    """Sans-IO: a QoS 0 publish is forwarded and not acknowledged; a client
    that is gone gets nothing more; DISCONNECT and PUBACK make nothing."""
    table = RelayTable[str]()
    assert table.packet("s", mqtt.PacketReader().feed(mqtt.subscribe(1, "t", 0))[0])
    (publish,) = mqtt.PacketReader().feed(mqtt.publish("t", b"x", 0, 0))
    ((to, data),) = table.packet("p", publish)
    (forwarded,) = mqtt.PacketReader().feed(data)
    assert to == "s"
    assert mqtt.parse_publish(forwarded) == mqtt.Publish("t", b"x", 0, 0)
    table.forget("s")
    assert table.packet("p", publish) == []
    for data in (mqtt.puback(3), mqtt.disconnect()):
        (packet,) = mqtt.PacketReader().feed(data)
        assert table.packet("p", packet) == []
