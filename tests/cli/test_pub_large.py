"""``broker pub --file`` of a 1 MiB file to ``broker sub`` on a broker of
the defaults (64 KiB frames), and a file over the broker's ``max_message``
refused in one line. On the base code the 1 MiB file was refused ("exceeds
max_frame")."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from .helpers import Served, Subscriber, run


def test_a_1_mib_file_goes_from_pub_to_sub_and_one_over_the_limit_is_refused(
    served: Served, tmp_path: Path
) -> None:
    image = tmp_path / "one-mib.bin"
    image.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    too_large = tmp_path / "nine-mib.bin"
    too_large.write_bytes(b"x" * (9 * 1024 * 1024))  # max_message is 8 MiB
    subscriber = Subscriber("big", "--json", "--count", "2", "--broker", served.address)
    try:
        sent = run("pub", "big", "--file", str(image), "--broker", served.address)
        assert sent.returncode == 0, sent.stderr
        assert sent.stderr == "published 1 message(s) to 'big'\n"
        refused = run("pub", "big", "--file", str(too_large), "--broker", served.address)
        assert refused.returncode == 1
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert "max_message (8388608 bytes)" in refused.stderr
        after = run("pub", "big", "after", "--broker", served.address)
        assert after.returncode == 0, after.stderr
        status, out, err = subscriber.finish()
    finally:
        subscriber.kill()
    assert status == 0, err
    payloads = []
    for line in out.decode().splitlines():
        message = json.loads(line)
        data = message["payload"]
        payloads.append(
            base64.b64decode(data) if message["encoding"] == "base64" else data.encode()
        )
    assert payloads == [image.read_bytes(), b"after"]


def test_pub_help_states_the_limit() -> None:
    result = run("pub", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "max_message (8 MiB by default" in text
    assert "refused before it is sent" in text
