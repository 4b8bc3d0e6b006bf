"""``BROKER_*`` environment variables: the prefix of the settings' names,
the names that mean something else, and what to say of one that is no
setting (a likely misspelling, or a name after another server's habits)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["ENV_PREFIX", "OTHER_ENV", "mistaken_names", "settings_in"]

ENV_PREFIX = "BROKER_"
#: BROKER_ environment variables that are not settings but mean something:
#: the client's token, the config file, a worker's setup (from its
#: supervisor), the logging level (read by the command).
OTHER_ENV = frozenset({"BROKER_TOKEN", "BROKER_CONFIG", "BROKER_WORKER_SPEC", "BROKER_LOG_LEVEL"})
#: Names users give the settings after other servers' habits (``BROKER_PORT``):
#: the setting each most likely means.
ENV_HINTS = {
    "port": "listen",
    "host": "listen",
    "bind": "listen",
    "address": "listen",
    "metrics_port": "metrics_listen",
    "metrics_host": "metrics_listen",
    "metrics_address": "metrics_listen",
    "mqtt": "mqtt_listen",
    "mqtt_port": "mqtt_listen",
    "mqtt_host": "mqtt_listen",
    "mqtt_address": "mqtt_listen",
    "data": "data_dir",
    "datadir": "data_dir",
    "data_path": "data_dir",
    "auth": "auth_file",
    "tls_certfile": "tls_cert",
    "tls_keyfile": "tls_key",
    "cert": "tls_cert",
    "key": "tls_key",
}


def settings_in(env: Mapping[str, str], settings: Iterable[str]) -> dict[str, str]:
    """The values ``env`` gives ``settings`` (``BROKER_<NAME>``), by setting name."""
    names = set(settings)
    found = {}
    for key, value in env.items():
        name = key[len(ENV_PREFIX) :].lower()
        if key.startswith(ENV_PREFIX) and name in names:
            found[name] = value
    return found


def mistaken_names(env: Iterable[str], settings: Iterable[str]) -> list[tuple[str, str]]:
    """``(variable, the variable meant)`` for each ``BROKER_`` name of
    ``env`` that is no setting but looks like one, sorted. Only a likely
    mistake is said: other software uses ``BROKER_`` names of its own
    (Celery's ``BROKER_URL``), which are no concern here."""
    names = list(settings)
    mistaken = []
    for key in sorted(env):
        name = key[len(ENV_PREFIX) :].lower()
        if not key.startswith(ENV_PREFIX) or name in names or key in OTHER_ENV:
            continue
        close = [ENV_HINTS[name]] if name in ENV_HINTS else []
        close = close or difflib.get_close_matches(name, names, n=1, cutoff=0.8)
        if close:
            mistaken.append((key, ENV_PREFIX + close[0].upper()))
    return mistaken
