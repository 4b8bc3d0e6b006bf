"""Auth-file topic patterns that could never match a valid topic name are
refused when the file is read, with an AuthError naming the principal, the
setting and the rule; patterns that can match load as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.auth import AuthError, Principal, load_auth_file


def auth_file(tmp_path: Path, key: str, patterns: list[str]) -> Path:
    path = tmp_path / "auth.toml"
    # JSON string syntax is valid TOML for basic strings (escapes included).
    listed = ", ".join(json.dumps(p, ensure_ascii=True) for p in patterns)
    path.write_text(f'[principals.etl]\ntoken = "secret"\n{key} = [{listed}]\n', encoding="utf-8")
    return path


@pytest.mark.parametrize("key", ["publish", "subscribe"])
@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("events\n*", "U+000A"),
        ("events *", "U+0020"),
        ("\u202eevents", "U+202E"),
        ("cafe\u0301.*", "NFC"),
        ("x" * 300, "300 bytes or more"),
    ],
)
def test_a_pattern_that_never_matches_is_refused(
    tmp_path: Path, key: str, pattern: str, says: str
) -> None:
    with pytest.raises(AuthError) as raised:
        load_auth_file(auth_file(tmp_path, key, ["ok.*", pattern]))
    message = str(raised.value)
    assert "principal 'etl'" in message and f"{key} pattern" in message and says in message


def test_patterns_that_can_match_load(tmp_path: Path) -> None:
    patterns = ["*", "events.*", "[!x]?", "café.*", "x" * 255]
    table = load_auth_file(auth_file(tmp_path, "publish", patterns))
    principal = table.authenticate("secret", None)
    assert isinstance(principal, Principal)
    assert principal.publish == tuple(patterns)
