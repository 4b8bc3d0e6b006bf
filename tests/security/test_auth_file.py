"""The auth file (``broker.auth``): principals, tokens, identities and limits.

Loading is strict: every malformed or inconsistent file is an :class:`AuthError`
whose message names the file and the principal and setting at fault, never
another exception. A loaded :class:`AuthTable` proves a principal by token
(compared by SHA-256 digest) or, failing that, by certificate identity.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.auth import (
    AUTH_FAILURE_REASONS,
    AuthError,
    AuthFailure,
    AuthTable,
    Principal,
    load_auth_file,
    token_digest,
)
from broker.errors import BrokerError

ETL_TOKEN = "etl-secret-42"
OPS_TOKEN = "ops-tøken-✓"  # a plain token in the file, non-ASCII on purpose
OPS_SECOND_TOKEN = "ops-rotated"  # the same principal, by digest

VALID = f"""
# Three principals: by digest, by identity only, by plain token and identity.
[principals.spark-etl]
token_sha256 = "{token_digest(ETL_TOKEN)}"
max_connections = 32
budget_share = 0.25
publish = ["events.*"]
subscribe = []

[principals.dashboard]
identities = ["dashboard", "dashboard-2"]
publish = []

[principals.ops]
token = "{OPS_TOKEN}"
token_sha256 = "{token_digest(OPS_SECOND_TOKEN)}"
identities = ["ops.example.com"]
max_connections = 0
budget_share = 1
subscribe = ["metrics.*", "alerts.[a-c]*"]
"""

ALL_TOKENS = (ETL_TOKEN, OPS_TOKEN, OPS_SECOND_TOKEN)


def write(directory: Path, text: str, name: str = "auth.toml") -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def load(directory: Path, text: str) -> AuthTable:
    return load_auth_file(write(directory, text))


def refusal(directory: Path, text: str) -> tuple[Path, str]:
    """The path written and the message of the AuthError its loading raises."""
    path = write(directory, text)
    with pytest.raises(AuthError) as info:
        load_auth_file(path)
    return path, str(info.value)


@pytest.fixture
def table(tmp_path: Path) -> AuthTable:
    return load(tmp_path, VALID)


# --------------------------------------------------------------------------- a valid file


def test_a_valid_file_loads_every_principal_with_its_settings(table: AuthTable) -> None:
    assert table.principals == {
        "spark-etl": Principal(
            "spark-etl", max_connections=32, budget_share=0.25, publish=("events.*",), subscribe=()
        ),
        "dashboard": Principal("dashboard", publish=()),
        "ops": Principal("ops", budget_share=1.0, subscribe=("metrics.*", "alerts.[a-c]*")),
    }
    # Field types are exact: an integer budget_share of 1 becomes a float, lists tuples.
    ops = table.principals["ops"]
    assert type(ops.budget_share) is float
    assert type(ops.publish) is tuple and type(ops.subscribe) is tuple
    assert type(table.principals["spark-etl"].max_connections) is int


def test_load_accepts_a_string_path_too(tmp_path: Path) -> None:
    path = write(tmp_path, VALID)
    assert load_auth_file(str(path)).principals == load_auth_file(path).principals


def test_a_principal_is_frozen(table: AuthTable) -> None:
    principal = table.principals["spark-etl"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        principal.max_connections = 0  # type: ignore[misc]


def test_authenticate_by_digest_token(table: AuthTable) -> None:
    assert table.authenticate(ETL_TOKEN, None) is table.principals["spark-etl"]


def test_authenticate_by_plain_token_including_non_ascii(table: AuthTable) -> None:
    assert table.authenticate(OPS_TOKEN, None) is table.principals["ops"]


def test_a_principal_may_have_a_plain_token_and_a_digest(table: AuthTable) -> None:
    assert table.authenticate(OPS_SECOND_TOKEN, None) is table.principals["ops"]


def test_authenticate_by_identity(table: AuthTable) -> None:
    assert table.authenticate(None, "dashboard") is table.principals["dashboard"]
    assert table.authenticate(None, "dashboard-2") is table.principals["dashboard"]
    assert table.authenticate(None, "ops.example.com") is table.principals["ops"]


def test_a_token_takes_precedence_over_the_identity(table: AuthTable) -> None:
    # A right token wins over an identity that names another principal...
    assert table.authenticate(ETL_TOKEN, "dashboard") is table.principals["spark-etl"]
    assert table.authenticate(OPS_TOKEN, "dashboard") is table.principals["ops"]
    # ...and a wrong token is refused even though the certificate would do.
    assert table.authenticate("wrong", "dashboard") is AuthFailure.BAD_CREDENTIALS
    assert table.authenticate("wrong", "ops.example.com") is AuthFailure.BAD_CREDENTIALS
    # An empty token is still a token.
    assert table.authenticate("", "dashboard") is AuthFailure.BAD_CREDENTIALS


@pytest.mark.parametrize(
    "token",
    [
        "unknown",
        "",
        ETL_TOKEN + " ",
        " " + ETL_TOKEN,
        ETL_TOKEN[:-1],
        ETL_TOKEN.upper(),
        OPS_TOKEN.encode("utf-8").decode("latin-1"),  # the same bytes, read as Latin-1
        token_digest(ETL_TOKEN),  # the digest is not the token
        "dashboard",  # an identity is not a token
    ],
)
def test_an_unknown_token_is_bad_credentials(table: AuthTable, token: str) -> None:
    assert table.authenticate(token, None) is AuthFailure.BAD_CREDENTIALS


def test_no_credentials_at_all(table: AuthTable) -> None:
    assert table.authenticate(None, None) is AuthFailure.NO_CREDENTIALS


@pytest.mark.parametrize(
    "identity", ["nobody", "", "Dashboard", "dashboard ", "spark-etl", ETL_TOKEN, "ops"]
)
def test_an_unknown_identity_is_no_credentials(table: AuthTable, identity: str) -> None:
    # Identities are matched exactly (case-sensitive); principal names and tokens
    # are not identities.
    assert table.authenticate(None, identity) is AuthFailure.NO_CREDENTIALS


def test_failure_reasons_are_the_metric_labels() -> None:
    assert AUTH_FAILURE_REASONS == (
        "no_credentials",
        "bad_credentials",
        "connection_limit",
        "topic_denied",
    )
    assert tuple(AuthFailure(reason).value for reason in AUTH_FAILURE_REASONS) == (
        AUTH_FAILURE_REASONS
    )


# --------------------------------------------------------------------------- defaults and limits


def test_defaults_allow_everything_without_limits(tmp_path: Path) -> None:
    table = load(tmp_path, '[principals.minimal]\ntoken = "t"\n')
    principal = table.principals["minimal"]
    assert principal == Principal("minimal")
    assert principal.max_connections == 0
    assert principal.budget_share == 1.0 and type(principal.budget_share) is float
    assert principal.publish == ("*",) and principal.subscribe == ("*",)
    for topic in ("", "a", "events.a.b", "ÜNÏ/ç ✓", "*", "[x]"):
        assert principal.may_publish(topic)
        assert principal.may_subscribe(topic)
    assert principal.budget(12345) == 12345
    assert table.authenticate("t", None) is principal


def test_the_principal_dataclass_defaults_match_the_file_defaults() -> None:
    principal = Principal("p")
    assert (principal.max_connections, principal.budget_share) == (0, 1.0)
    assert (principal.publish, principal.subscribe) == (("*",), ("*",))


@pytest.mark.parametrize(
    ("share", "global_budget", "expected"),
    [
        (1.0, 1000, 1000),
        (0.25, 1000, 250),
        (0.5, 1000, 500),
        (0.5, 3, 1),  # rounded down: never more than the share
        (0.5, 1, 0),
        (0.25, 0, 0),
        (1.0, 1, 1),
        (0.125, 2**40, 2**37),
        (0.75, 64 * 1024 * 1024, 48 * 1024 * 1024),
        (1e-9, 10**6, 0),
    ],
)
def test_budget_is_the_share_of_the_global_budget_rounded_down(
    share: float, global_budget: int, expected: int
) -> None:
    got = Principal("p", budget_share=share).budget(global_budget)
    assert got == expected
    assert type(got) is int


def test_budget_from_the_file(table: AuthTable) -> None:
    assert table.principals["spark-etl"].budget(1 << 30) == 1 << 28
    assert table.principals["dashboard"].budget(1 << 30) == 1 << 30
    assert table.principals["ops"].budget(7) == 7


@given(
    share=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    global_budget=st.integers(min_value=0, max_value=1 << 40),
)
def test_budget_stays_within_zero_and_the_global_budget(share: float, global_budget: int) -> None:
    got = Principal("p", budget_share=share).budget(global_budget)
    assert type(got) is int
    assert 0 <= got <= global_budget
    assert got <= global_budget * share


@pytest.mark.parametrize(
    ("pattern", "topic", "matches"),
    [
        ("events.*", "events.a", True),
        ("events.*", "events.a.b", True),  # '*' crosses dots
        ("events.*", "events.", True),
        ("events.*", "events", False),
        ("events.*", "x.events.a", False),  # anchored at the start
        ("events.*", "Events.a", False),  # case-sensitive
        ("EVENTS.*", "events.a", False),
        ("events", "events", True),
        ("events", "events.a", False),  # anchored at the end
        ("*", "", True),
        ("*.log", "a.b.log", True),
        ("a?c", "abc", True),
        ("a?c", "a.c", True),
        ("a?c", "ac", False),
        ("alerts.[a-c]*", "alerts.b1", True),
        ("alerts.[a-c]*", "alerts.d", False),
        ("alerts.[a-c]*", "alerts.B", False),
        ("[!x]*", "y", True),
        ("[!x]*", "x", False),
        ("ünï.*", "ünï.✓", True),
    ],
)
def test_topic_patterns_are_case_sensitive_fnmatch(pattern: str, topic: str, matches: bool) -> None:
    principal = Principal("p", publish=(pattern,), subscribe=(pattern,))
    assert principal.may_publish(topic) is matches
    assert principal.may_subscribe(topic) is matches


def test_any_pattern_of_several_allows(table: AuthTable) -> None:
    ops = table.principals["ops"]
    assert ops.may_subscribe("metrics.cpu")
    assert ops.may_subscribe("alerts.critical")
    assert not ops.may_subscribe("alerts.warning")
    assert not ops.may_subscribe("events.a")
    assert ops.may_publish("anything.at.all")  # publish left at its default


def test_publish_and_subscribe_are_separate(table: AuthTable) -> None:
    etl = table.principals["spark-etl"]
    assert etl.may_publish("events.a.b")
    assert not etl.may_publish("metrics.cpu")
    assert not etl.may_publish("Events.a")
    assert not etl.may_subscribe("events.a.b")
    dashboard = table.principals["dashboard"]
    assert dashboard.may_subscribe("events.a.b")
    assert not dashboard.may_publish("events.a.b")


@pytest.mark.parametrize("topic", ["", "*", "events.a", "x"])
def test_an_empty_pattern_list_denies_every_topic(topic: str) -> None:
    principal = Principal("p", publish=(), subscribe=())
    assert not principal.may_publish(topic)
    assert not principal.may_subscribe(topic)


# --------------------------------------------------------------------------- file-level errors


def test_a_missing_file_is_an_auth_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(AuthError) as info:
        load_auth_file(path)
    message = str(info.value)
    assert "cannot read auth file" in message
    assert str(path) in message
    assert "No such file" in message


def test_a_directory_is_an_auth_error(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="cannot read auth file"):
        load_auth_file(tmp_path)


def test_auth_error_is_a_broker_error() -> None:
    assert issubclass(AuthError, BrokerError)


@pytest.mark.parametrize(
    "text",
    [
        "[principals.a\ntoken = 't'\n",  # unclosed table header
        "[principals.a]\ntoken = \n",  # no value
        "[principals.a]\ntoken = 't'\ntoken = 'u'\n",  # duplicate key
        "[principals.a]\ntoken = 't'\n[principals.a]\ntoken = 'u'\n",  # duplicate table
        '[principals.a]\ntoken = "\\uD800"\n',  # a surrogate escape
        '[principals.a]\ntoken = "bad \\q escape"\n',
    ],
    ids=["unclosed header", "no value", "duplicate key", "duplicate table", "surrogate", "escape"],
)
def test_bad_toml_is_an_auth_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path, message = refusal(tmp_path, text)
    assert message.startswith(f"auth file {path}: ")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# nothing but a comment\n",
        "[principals]\n",
        "principals = 5\n",
        'principals = "a"\n',
        "principals = []\n",
        "[[principals]]\ntoken = 't'\n",
        "[clients.a]\ntoken = 't'\n",
    ],
    ids=[
        "empty file",
        "comment only",
        "empty principals",
        "principals int",
        "principals string",
        "principals array",
        "array of tables",
        "other table only",
    ],
)
def test_a_file_without_principal_tables_is_refused(tmp_path: Path, text: str) -> None:
    path, message = refusal(tmp_path, text)
    assert str(path) in message
    assert "[principals.NAME]" in message


@pytest.mark.parametrize(
    "extra",
    ["version = 1\n", "[other]\nx = 1\n", "[defaults]\nbudget_share = 0.5\n"],
    ids=["top-level key", "top-level table", "defaults table"],
)
def test_anything_beside_principals_is_refused(tmp_path: Path, extra: str) -> None:
    path, message = refusal(tmp_path, extra + VALID)
    assert str(path) in message
    assert "nothing else" in message


# --------------------------------------------------------------------------- principal errors


@pytest.mark.parametrize(
    "name",
    ["bad name", "_hidden", "-dash", ".dot", "", "x" * 65, "naïve", "a/b", "a:b", "a\tb"],
)
def test_a_bad_principal_name_is_refused(tmp_path: Path, name: str) -> None:
    escaped = name.replace("\t", "\\t")
    path, message = refusal(tmp_path, f'[principals."{escaped}"]\ntoken = "t"\n')
    assert message.startswith(f"auth file {path}: principal {name!r}: names are")


@pytest.mark.parametrize("name", ["a", "Z", "9lives", "A.b_c-9", "x" * 64, "a..b", "a-"])
def test_good_principal_names_are_accepted(tmp_path: Path, name: str) -> None:
    table = load(tmp_path, f'[principals."{name}"]\ntoken = "t"\n')
    assert list(table.principals) == [name]
    assert table.principals[name].name == name


@pytest.mark.parametrize(
    "value", ['"t"', '["t"]', "5", "true"], ids=["string", "array", "int", "bool"]
)
def test_a_principal_that_is_not_a_table_is_refused(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, f"[principals]\nsolo = {value}\n")
    assert message == f"auth file {path}: principal 'solo' must be a table"


def test_an_unknown_setting_is_refused_and_named(tmp_path: Path) -> None:
    path, message = refusal(tmp_path, '[principals.a]\ntoken = "t"\ntokens = "u"\n')
    assert message == f"auth file {path}: principal 'a': unknown setting(s) ['tokens']"


def test_every_unknown_setting_is_named_in_order(tmp_path: Path) -> None:
    text = '[principals.a]\ntoken = "t"\nzeta = 1\nalpha = 2\n[principals.a.nested]\nx = 1\n'
    _, message = refusal(tmp_path, text)
    assert "principal 'a': unknown setting(s) ['alpha', 'nested', 'zeta']" in message


@pytest.mark.parametrize(
    "settings_text",
    ["", "max_connections = 1\n", "identities = []\n", 'publish = ["*"]\nbudget_share = 0.5\n'],
    ids=["empty", "limits only", "empty identities", "patterns only"],
)
def test_a_principal_without_credentials_is_refused(tmp_path: Path, settings_text: str) -> None:
    path, message = refusal(tmp_path, f"[principals.anon]\n{settings_text}")
    assert message == (
        f"auth file {path}: principal 'anon': needs a token, token_sha256 or identities"
    )


def _digest_text(value: str) -> str:
    return f"[principals.hashed]\ntoken_sha256 = {value}\n"


@pytest.mark.parametrize(
    "value",
    [
        f'"{token_digest("x").upper()}"',
        f'"{token_digest("x")[:-1]}"',
        f'"{token_digest("x")}0"',
        f'"{token_digest("x")[:-1]}g"',
        f'"sha256:{token_digest("x")}"',
        f'" {token_digest("x")}"',
        f'"{token_digest("x")}\\n"',
        '"secret"',
    ],
    ids=["upper case", "63 digits", "65 digits", "non-hex", "prefixed", "space", "newline", "word"],
)
def test_token_sha256_must_be_64_lower_case_hex_digits(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, _digest_text(value))
    assert message == (
        f"auth file {path}: principal 'hashed': token_sha256 must be 64 lower-case hex digits"
    )


@pytest.mark.parametrize(
    "value", ['""', "5", f'["{token_digest("x")}"]', "true"], ids=["empty", "int", "array", "bool"]
)
def test_token_sha256_must_be_a_string(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, _digest_text(value))
    assert message == (
        f"auth file {path}: principal 'hashed': token_sha256 must be a non-empty string"
    )


@pytest.mark.parametrize(
    "value", ['""', "5", '["t"]', "true", "1.5"], ids=["empty", "int", "array", "bool", "float"]
)
def test_token_must_be_a_non_empty_string(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, f"[principals.plain]\ntoken = {value}\n")
    assert message == f"auth file {path}: principal 'plain': token must be a non-empty string"


@pytest.mark.parametrize(
    "value",
    ['"dashboard"', '[""]', "[1]", '["a", ""]', '[["a"]]', "{ cn = 'a' }"],
    ids=["string", "empty string", "int", "one empty", "nested", "table"],
)
def test_identities_must_be_a_list_of_non_empty_strings(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, f"[principals.cert]\nidentities = {value}\n")
    assert message == (
        f"auth file {path}: principal 'cert': identities must be a list of non-empty strings"
    )


@pytest.mark.parametrize(
    "value",
    ["-1", "true", "false", "1.5", "2.0", '"3"', "[1]", "inf"],
    ids=["negative", "true", "false", "float", "integral float", "string", "array", "inf"],
)
def test_max_connections_must_be_an_integer_at_least_zero(tmp_path: Path, value: str) -> None:
    path, message = refusal(
        tmp_path, f'[principals.busy]\ntoken = "t"\nmax_connections = {value}\n'
    )
    assert message == f"auth file {path}: principal 'busy': max_connections must be an integer >= 0"


@pytest.mark.parametrize("value", [0, 1, 10_000])
def test_max_connections_accepts_integers_from_zero(tmp_path: Path, value: int) -> None:
    table = load(tmp_path, f'[principals.busy]\ntoken = "t"\nmax_connections = {value}\n')
    assert table.principals["busy"].max_connections == value


@pytest.mark.parametrize(
    "value",
    ["0", "0.0", "-0.0", "-0.5", "1.0000001", "2", '"0.5"', "true", "nan", "inf", "[0.5]"],
    ids=[
        "zero",
        "zero float",
        "negative zero",
        "negative",
        "just above one",
        "two",
        "string",
        "bool",
        "nan",
        "inf",
        "array",
    ],
)
def test_budget_share_must_be_a_number_in_zero_one(tmp_path: Path, value: str) -> None:
    path, message = refusal(tmp_path, f'[principals.greedy]\ntoken = "t"\nbudget_share = {value}\n')
    assert message == (
        f"auth file {path}: principal 'greedy': budget_share must be a number in (0, 1]"
    )


@pytest.mark.parametrize(
    ("value", "share"), [("1", 1.0), ("1.0", 1.0), ("0.5", 0.5), ("1e-6", 1e-6)]
)
def test_budget_share_accepts_numbers_in_zero_one(tmp_path: Path, value: str, share: float) -> None:
    table = load(tmp_path, f'[principals.share]\ntoken = "t"\nbudget_share = {value}\n')
    got = table.principals["share"].budget_share
    assert got == share and type(got) is float and math.isfinite(got)


@pytest.mark.parametrize("setting", ["publish", "subscribe"])
@pytest.mark.parametrize(
    "value",
    ['"events.*"', '[""]', '["ok", ""]', "[1]", '[["a"]]', "true", "{ a = 'b' }"],
    ids=["string", "empty string", "one empty", "int", "nested", "bool", "table"],
)
def test_patterns_must_be_a_list_of_non_empty_strings(
    tmp_path: Path, setting: str, value: str
) -> None:
    path, message = refusal(tmp_path, f'[principals.topics]\ntoken = "t"\n{setting} = {value}\n')
    assert message == (
        f"auth file {path}: principal 'topics': {setting} must be a list of non-empty strings"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ('token = "shared"', 'token = "shared"'),
        ('token = "shared"', f'token_sha256 = "{token_digest("shared")}"'),
        (
            f'token_sha256 = "{token_digest("shared")}"',
            f'token_sha256 = "{token_digest("shared")}"',
        ),
    ],
    ids=["plain and plain", "plain and digest", "digest and digest"],
)
def test_two_principals_sharing_a_token_are_refused(
    tmp_path: Path, first: str, second: str
) -> None:
    _, message = refusal(tmp_path, f"[principals.one]\n{first}\n[principals.two]\n{second}\n")
    assert message == "principals 'one' and 'two' share a token"
    # The message names the principals, never the secret or its digest.
    assert "shared" not in message and token_digest("shared") not in message


def test_two_principals_sharing_an_identity_are_refused(tmp_path: Path) -> None:
    text = (
        '[principals.one]\nidentities = ["a", "common"]\n'
        '[principals.two]\ntoken = "t"\nidentities = ["common"]\n'
    )
    _, message = refusal(tmp_path, text)
    assert "'one'" in message and "'two'" in message
    assert "identity 'common'" in message
    assert "share" in message


def test_one_principal_may_repeat_its_own_token_and_identity(tmp_path: Path) -> None:
    text = (
        f'[principals.same]\ntoken = "t"\ntoken_sha256 = "{token_digest("t")}"\n'
        'identities = ["cn", "cn"]\n'
    )
    table = load(tmp_path, text)
    assert table.authenticate("t", None) is table.principals["same"]
    assert table.authenticate(None, "cn") is table.principals["same"]


def test_the_table_refuses_shared_digests_when_built_directly() -> None:
    digest = token_digest("x")
    with pytest.raises(AuthError, match="principals 'a' and 'b' share a token"):
        AuthTable([(Principal("a"), [digest], []), (Principal("b"), [digest], [])])
    with pytest.raises(AuthError, match="principals 'a' and 'b' share an identity 'cn'"):
        AuthTable([(Principal("a"), [], ["cn"]), (Principal("b"), [], ["cn"])])


def test_a_token_and_an_identity_may_be_equal_strings(tmp_path: Path) -> None:
    # Tokens and identities are separate namespaces.
    text = '[principals.one]\ntoken = "same"\n[principals.two]\nidentities = ["same"]\n'
    table = load(tmp_path, text)
    assert table.authenticate("same", None) is table.principals["one"]
    assert table.authenticate(None, "same") is table.principals["two"]


def test_a_file_that_is_not_utf8_is_an_auth_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[principals.a]\ntoken = "pässwörd"\n'.encode("latin-1"))
    with pytest.raises(AuthError, match="auth file"):
        load_auth_file(path)


# --------------------------------------------------------------------------- digests and secrecy


@pytest.mark.parametrize("token", ["", "s3cret", "pässwörd ✓ 🔑", "x" * 10_000, "a\x00b"])
def test_token_digest_is_the_hex_sha256_of_the_utf8_token(token: str) -> None:
    digest = token_digest(token)
    assert digest == hashlib.sha256(token.encode("utf-8")).hexdigest()
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")


def test_token_digest_known_value() -> None:
    # The example of the module docstring: the SHA-256 of "password".
    assert token_digest("password") == (
        "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
    )


@given(st.text())
def test_token_digest_matches_hashlib(token: str) -> None:
    assert token_digest(token) == hashlib.sha256(token.encode("utf-8")).hexdigest()


def test_a_principal_holds_no_secret() -> None:
    names = {field.name for field in dataclasses.fields(Principal)}
    assert names == {"name", "max_connections", "budget_share", "publish", "subscribe", "admin"}


def test_no_token_or_digest_appears_in_a_repr(table: AuthTable) -> None:
    shown = [repr(table), str(table)]
    for principal in table.principals.values():
        shown += [repr(principal), str(principal)]
    shown.append(repr(table.principals))
    for secret in ALL_TOKENS:
        for text in shown:
            assert secret not in text
            assert token_digest(secret) not in text


# --------------------------------------------------------------------------- properties


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string (control characters and DEL escaped)."""
    out = []
    for char in value:
        if char in '"\\' or ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@settings(max_examples=60, deadline=None)
@given(token=st.text())
def test_a_digest_entry_authenticates_its_token_and_nothing_longer(
    tmp_path_factory: pytest.TempPathFactory, token: str
) -> None:
    path = tmp_path_factory.getbasetemp() / "property-digest.toml"
    path.write_text(
        f'[principals.p]\ntoken_sha256 = "{token_digest(token)}"\n'
        '[principals.other]\ntoken_sha256 = "' + "0" * 64 + '"\n',
        encoding="utf-8",
    )
    table = load_auth_file(path)
    assert table.authenticate(token, None) is table.principals["p"]
    assert table.authenticate(token, "any-identity") is table.principals["p"]
    assert table.authenticate(token + "x", None) is AuthFailure.BAD_CREDENTIALS
    assert table.authenticate("x" + token, None) is AuthFailure.BAD_CREDENTIALS


@settings(max_examples=60, deadline=None)
@given(token=st.text(min_size=1))
def test_a_plain_token_entry_authenticates_exactly_that_token(
    tmp_path_factory: pytest.TempPathFactory, token: str
) -> None:
    path = tmp_path_factory.getbasetemp() / "property-plain.toml"
    path.write_text(f"[principals.p]\ntoken = {toml_string(token)}\n", encoding="utf-8")
    table = load_auth_file(path)
    assert table.authenticate(token, None) is table.principals["p"]
    assert table.authenticate(token + "x", None) is AuthFailure.BAD_CREDENTIALS
    assert table.authenticate(token[:-1], None) is AuthFailure.BAD_CREDENTIALS
    assert table.authenticate(None, token) is AuthFailure.NO_CREDENTIALS


@given(token=st.text(), other=st.text())
def test_a_table_built_directly_refuses_every_other_token(token: str, other: str) -> None:
    principal = Principal("p")
    table = AuthTable([(principal, [token_digest(token)], [])])
    expected = principal if other == token else AuthFailure.BAD_CREDENTIALS
    assert table.authenticate(other, None) is expected


def test_the_table_refuses_a_principal_defined_twice() -> None:
    with pytest.raises(AuthError, match="principal 'a' is defined twice"):
        AuthTable([(Principal("a"), [token_digest("x")], []), (Principal("a"), [], ["cn"])])
