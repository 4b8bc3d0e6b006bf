"""From the command line, end to end: ``broker serve`` with TLS and an auth file
made by ``broker token``; ``broker sub`` and ``broker pub`` with ``--cafile`` and
a token (flag or ``$BROKER_TOKEN``); a wrong token fails plainly with code 6."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .conftest import Pki

TIMEOUT = 30


def broker(*args: str) -> list[str]:
    return [sys.executable, "-m", "broker", *args]


def run(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        broker(*args),
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_tls_and_tokens_from_the_command_line(pki: Pki, tmp_path: Path) -> None:
    made = run("token", "cli")
    assert made.returncode == 0, made.stderr
    token = made.stderr.strip().removeprefix("token: ")
    auth = tmp_path / "auth.toml"
    auth.write_text(made.stdout)
    config = tmp_path / "broker.toml"
    config.write_text(
        "[broker]\n"
        'listen = "127.0.0.1:0"\n'
        'metrics_listen = ""\n'
        f'tls_cert = "{pki.server_cert}"\n'
        f'tls_key = "{pki.server_key}"\n'
        f'auth_file = "{auth}"\n'
    )
    server = subprocess.Popen(
        broker("--log-level", "ERROR", "serve", "--memory-only"),
        env={**os.environ, "BROKER_CONFIG": str(config)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        listening = server.stdout.readline()
        assert listening.startswith("broker listening on "), listening
        address = "tls://" + listening.split()[-1]
        secure = ("--broker", address, "--cafile", str(pki.ca))
        subscriber = subprocess.Popen(
            broker("sub", "news", "--count", "2", *secure, "--token", token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert subscriber.stderr is not None
            assert "subscribed to 'news'" in subscriber.stderr.readline()
            with_env = {**os.environ, "BROKER_TOKEN": token}
            published = run("pub", "news", *secure, env=with_env, stdin="one\ntwo\n")
            assert published.returncode == 0, published.stderr
            out, _ = subscriber.communicate(timeout=TIMEOUT)
            assert out.splitlines() == ["one", "two"]
            assert subscriber.returncode == 0
        finally:
            if subscriber.poll() is None:
                subscriber.kill()
            subscriber.communicate(timeout=TIMEOUT)

        wrong = run("pub", "news", "x", *secure, "--token", "wrong")
        assert wrong.returncode == 1
        assert wrong.stderr == (
            "broker pub: goodbye 6: not authorised: bad credentials"
            " (check --token, or $BROKER_TOKEN)\n"
        )
        missing = run("pub", "news", "x", *secure, env={**os.environ, "BROKER_TOKEN": ""})
        assert missing.returncode == 1
        assert missing.stderr == (
            "broker pub: goodbye 6: not authorised: credentials required"
            " (give --token, or set $BROKER_TOKEN)\n"
        )
        untrusted = run("pub", "news", "x", "--broker", address, "--token", token)
        assert untrusted.returncode == 1
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
        # It gave OpenSSL's reason alone: the line now says what to pass.
        assert "give the CA that signed it with --cafile PEM" in untrusted.stderr
        assert len(untrusted.stderr.splitlines()) == 1
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(TIMEOUT) == 0
        server.communicate(timeout=TIMEOUT)
