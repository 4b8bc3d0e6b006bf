"""Where ``broker serve`` keeps its topic logs: the default data directory,
and making sure the one chosen exists and is writable before the broker starts."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from broker.config import BrokerConfig, ConfigError

__all__ = ["default_data_dir", "prepare_data_dir", "with_data_dir"]

#: Said when the directory cannot be used (appended to the reason).
_HINT = "choose another with --data-dir, or run with --memory-only"


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The data directory of a broker that names none: ``$STATE_DIRECTORY``
    (systemd's ``StateDirectory=``; the first one if it lists several), else
    ``$XDG_STATE_HOME/broker`` (an absolute ``XDG_STATE_HOME`` only, as the
    XDG spec says), else ``~/.local/state/broker`` (``$HOME``'s)."""
    env = os.environ if environ is None else environ
    state = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state:
        return Path(state)
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "broker"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "broker"


def with_data_dir(config: BrokerConfig, environ: Mapping[str, str] | None = None) -> BrokerConfig:
    """``config`` with an empty ``data_dir`` filled with :func:`default_data_dir`
    (unchanged if it names one or is memory-only)."""
    if config.memory_only or config.data_dir:
        return config
    return config.replace(data_dir=str(default_data_dir(environ)))


def prepare_data_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if missing and check that this process
    can create files in it; raise :class:`ConfigError` with a one-line message
    naming the directory and the reason if not. Taking its lock is the log
    store's job (:class:`broker.log.LogStore`)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)  # payloads: the owner only
    except FileExistsError:
        raise ConfigError(f"data directory {path} is not a directory ({_HINT})") from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(f"cannot create data directory {path}: {reason} ({_HINT})") from None
    if not path.is_dir():
        raise ConfigError(f"data directory {path} is not a directory ({_HINT})")
    try:
        # A real write, not os.access(): root, read-only mounts and ACLs
        # answer access() differently from what a write meets.
        with tempfile.TemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise ConfigError(f"data directory {path} is not writable: {reason} ({_HINT})") from None
