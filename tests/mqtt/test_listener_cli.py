"""``broker serve --mqtt-listen``: where it listens said in one line (after
the others), a taken port named in one line, the setting from the
environment, and a refusal where MQTT is not served yet."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import paho.mqtt.client as paho

from tests.cli.helpers import TIMEOUT, broker_command, run


def test_serve_says_where_mqtt_listens_and_serves_it() -> None:
    process = subprocess.Popen(
        broker_command(
            "--log-level", "WARNING", "serve", "--memory-only",
            "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--mqtt-listen", "127.0.0.1:0",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("broker listening on 127.0.0.1:")
        said = process.stdout.readline()
        assert said.startswith("MQTT on 127.0.0.1:"), said
        port = int(said.split(":")[-1])
        client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="cli")
        client.connect("127.0.0.1", port)
        client.loop_start()
        try:
            info = client.publish("cli/check", b"hello", qos=1)
            info.wait_for_publish(TIMEOUT)
            assert info.is_published()
        finally:
            client.disconnect()
            client.loop_stop()
            client._reset_sockets()
        process.send_signal(signal.SIGINT)
        assert process.wait(TIMEOUT) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=TIMEOUT)


def test_a_taken_mqtt_port_is_one_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run(
            "serve", "--memory-only", "--listen", "127.0.0.1:0", "--metrics-listen", "",
            "--mqtt-listen", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"broker serve: cannot listen for MQTT clients on 127.0.0.1:{port}: Address already "
        "in use (another process has it: stop it, or choose another with --mqtt-listen)\n"
    )


def test_mqtt_listen_from_the_environment_and_where_it_is_refused() -> None:
    env = {**os.environ, "BROKER_MQTT_LISTEN": "nonsense"}
    result = run("serve", "--memory-only", env=env)
    assert result.returncode == 2
    assert "mqtt_listen" in result.stderr or "nonsense" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    result = run("serve", "--memory-only", "--workers", "2", "--mqtt-listen", "127.0.0.1:0")
    assert result.returncode == 2
    assert result.stderr == (
        "broker serve: mqtt_listen: MQTT is served by a single-process broker only for now "
        "(workers = 1, no cluster)\n"
    )
