"""``broker token NAME``: a new token, and an auth-file entry that admits it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import cli
from broker.auth import load_auth_file


@pytest.mark.parametrize("name", ["spark-etl", "svc.billing"])
def test_the_printed_entry_admits_the_printed_token_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A dotted name's table was printed as ``[principals.svc.billing]``
    (table svc's table billing): appended to the auth file, it stopped the
    broker from starting."""
    assert cli.main(["token", name]) == 0
    captured = capsys.readouterr()
    token = captured.err.strip().removeprefix("token: ")
    assert len(token) >= 40
    # The comment said the token was "above", on stdout, where it is not.
    assert "stderr" in captured.out.splitlines()[0]
    assert "above" not in captured.out
    assert token not in captured.out  # the entry holds only its digest
    path = tmp_path / "auth.toml"
    path.write_text(captured.out)
    table = load_auth_file(path)
    principal = table.authenticate(token, None)
    assert getattr(principal, "name", None) == name
    assert table.authenticate(token + "x", None) is not principal
    # Two calls never print the same token.
    assert cli.main(["token", "other"]) == 0
    assert token not in capsys.readouterr().err


def test_a_name_that_cannot_name_a_principal_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["token", "not a name"]) == 2
    assert "names are 1-64" in capsys.readouterr().err


def test_a_token_never_starts_with_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token starting with "-" (1 in 64 from the URL-safe alphabet) made
    `broker sub --token <it>` a usage error: one is drawn again instead."""
    import secrets

    drawn = iter(["-starts-with-a-dash", "fine-token"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda _n: next(drawn))
    assert cli.main(["token", "svc"]) == 0
    assert capsys.readouterr().err.strip() == "token: fine-token"
