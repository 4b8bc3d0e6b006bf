"""The cluster front end's start-up checks of its NATS servers, sans-IO: the
server's INFO and the answers to a JSZ ping in, one-line problems out.

What a client can learn over the client port (nats-server 2.15.1, checked
against its source and a running server):

- The ``INFO`` line every connection begins with names the server
  (``server_name``), its ``version``, ``jetstream: true`` when JetStream is
  on (the field is absent otherwise), ``cluster`` (the cluster's name) and
  ``api_lvl`` (the JetStream API level, 5 on 2.15). It says nothing of how
  JetStream stores data.
- ``$JS.API.INFO`` (account info) has usage, limits and the API level, no
  storage settings.
- ``$SYS.REQ.SERVER.PING.JSZ`` (:data:`JSZ_PING_SUBJECT`) is answered by
  every server of the cluster, one message each: ``{"server": {"name",
  "ver", "jetstream", ...}, "data": <the /jsz document>}``, whose
  ``data.config.sync_always`` is ``true`` only with ``jetstream {
  sync_interval: always }`` (the field is left out otherwise;
  ``sync_interval`` reads the 2-minute default either way),
  ``data.disabled`` is ``true`` on a server without JetStream, and
  ``data.meta_cluster.cluster_size`` says how many answers to expect.
  Only the system account may request it: a user of the system account, or
  an application account that imports the service, which the operator
  grants in the server's config::

      accounts {
        SYS { users [...]
              exports [{service: "$SYS.REQ.SERVER.PING.JSZ", response: stream}] }
        APP { jetstream: enabled, users [...]
              imports [{service: {account: SYS, subject: "$SYS.REQ.SERVER.PING.JSZ"}}] }
      }
      system_account: SYS

  (``response: stream`` lets every server's answer through, not only the
  first.) A user that may not request it gets ``503`` no responders (its
  account has no such service) or, with publish permissions that leave
  the subject out, a permissions violation: the front end then cannot
  verify the sync setting, and says so (:func:`check_server` with
  ``jsz_answers=None``).

The minimum version, :data:`MINIMUM_VERSION` (2.10.23): ``sync_interval:
always`` exists since 2.10.0, but until 2.10.23 (and 2.11.0) it applied to
the streams' message blocks only, not to the Raft logs of replicated
streams, which are what a quorum acknowledges (nats-server commit 601ec42,
"NRG: Use configured sync intervals for group stores"), and since
nats-server's main branch of 2026 (commit 930f4c2, "NRG: Relax SyncAlways
for replicated streams", in 2.15) a replicated stream's own blocks are
synced only at snapshots, the Raft log carrying each write. The spike's
measurements were made on 2.15.1.

A stream created with ``persist_mode: "async"`` (2.12 and later) does not
sync its writes whatever the server says: :func:`check_stream_config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = [
    "JSZ_PING_SUBJECT",
    "MINIMUM_VERSION",
    "UNSAFE_SYNC_FLAG",
    "check_info",
    "check_jsz",
    "check_server",
    "check_stream_config",
    "expected_answers",
    "parse_version",
    "servers_not_answering",
]

#: Every server of the cluster answers a request here with its JSZ.
JSZ_PING_SUBJECT: Final = "$SYS.REQ.SERVER.PING.JSZ"

#: The oldest nats-server whose ``sync_interval: always`` fsyncs the Raft
#: logs of replicated streams too (see the module's docstring).
MINIMUM_VERSION: Final = (2, 10, 23)

#: The option that lets a front end run without ``sync_interval: always``.
UNSAFE_SYNC_FLAG: Final = "--cluster-unsafe-sync"

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: object) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a server version (``"2.15.1"``,
    ``"v2.11.0-RC.1"``, ``"2.15.0-dev"``), or ``None`` if it is not one."""
    if not isinstance(text, str):
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _dotted(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def _version_problem(name: str, text: object, minimum: tuple[int, int, int]) -> str | None:
    version = parse_version(text)
    if version is None:
        return f"nats-server {name} announced no version that can be read ({text!r})"
    if version < minimum:
        return (
            f"nats-server {name} is {text}, too old: cluster mode needs "
            f"{_dotted(minimum)} or later (older servers do not fsync the Raft log "
            "of a replicated stream with sync_interval: always)"
        )
    return None


def check_info(
    info: Mapping[str, Any], *, minimum: tuple[int, int, int] = MINIMUM_VERSION
) -> list[str]:
    """The problems a server's INFO shows: a version older than ``minimum``
    or unreadable, JetStream off. Empty when there are none."""
    name = str(info.get("server_name") or info.get("server_id") or "?")
    problems = []
    version_problem = _version_problem(name, info.get("version"), minimum)
    if version_problem is not None:
        problems.append(version_problem)
    if not info.get("jetstream"):
        problems.append(
            f"nats-server {name} has JetStream off: cluster mode keeps every topic "
            "in JetStream; enable it with `jetstream { store_dir: ..., sync_interval: always }`"
        )
    return problems


def _parts(answer: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """``(server, data)`` of a JSZ ping answer, or ``({}, answer)`` for a
    bare ``/jsz`` document."""
    if "data" in answer and isinstance(answer.get("data"), Mapping):
        server = answer.get("server")
        return (server if isinstance(server, Mapping) else {}), answer["data"]
    return {}, answer


def _answer_name(answer: Mapping[str, Any]) -> str:
    server, data = _parts(answer)
    return str(server.get("name") or data.get("server_id") or "?")


def check_jsz(
    answer: Mapping[str, Any],
    *,
    unsafe_sync: bool = False,
    minimum: tuple[int, int, int] = MINIMUM_VERSION,
) -> list[str]:
    """The problems one server's JSZ shows (an answer to
    :data:`JSZ_PING_SUBJECT`, or a bare ``/jsz`` document): JetStream off,
    a version older than ``minimum``, and, unless ``unsafe_sync``, writes
    not synced one by one (``config.sync_always`` not true)."""
    server, data = _parts(answer)
    name = _answer_name(answer)
    problems = []
    if "ver" in server:
        version_problem = _version_problem(name, server["ver"], minimum)
        if version_problem is not None:
            problems.append(version_problem)
    if data.get("disabled") or server.get("jetstream") is False:
        problems.append(
            f"nats-server {name} has JetStream off: cluster mode keeps every topic "
            "in JetStream; enable it with `jetstream { store_dir: ..., sync_interval: always }`"
        )
    elif not unsafe_sync:
        config = data.get("config")
        if not (isinstance(config, Mapping) and config.get("sync_always") is True):
            problems.append(
                f"JetStream on nats-server {name} does not sync every write "
                "(sync_interval is not 'always'): confirmed records could be lost on a "
                "power cut; set `jetstream { sync_interval: always }` or run with "
                f"{UNSAFE_SYNC_FLAG}"
            )
    return problems


def check_server(
    info: Mapping[str, Any],
    jsz_answers: Sequence[Mapping[str, Any]] | None,
    *,
    unsafe_sync: bool = False,
    minimum: tuple[int, int, int] = MINIMUM_VERSION,
) -> list[str]:
    """Every problem, one line each, that should stop a front end from
    starting: those of the INFO of the server it connected to, and those of
    each server's answer to :data:`JSZ_PING_SUBJECT`.

    ``jsz_answers`` is ``None`` (or empty) when the request got no answer
    (no responders, a permissions violation, a timeout): unless
    ``unsafe_sync``, that is a problem too, since the sync setting cannot
    be verified. Servers that did not answer are not checked (see
    :func:`servers_not_answering`).
    """
    problems = check_info(info, minimum=minimum)
    if not jsz_answers:
        if not unsafe_sync:
            problems.append(
                "cannot verify that JetStream syncs every write: no answer to "
                f"{JSZ_PING_SUBJECT} (the NATS user needs the system account, or the "
                "service imported into its account with `response: stream`); "
                f"or run with {UNSAFE_SYNC_FLAG}"
            )
    else:
        for answer in jsz_answers:
            problems += check_jsz(answer, unsafe_sync=unsafe_sync, minimum=minimum)
    return list(dict.fromkeys(problems))


def expected_answers(answers: Sequence[Mapping[str, Any]]) -> int:
    """How many servers should answer a JSZ ping, as the answers so far say
    (the meta cluster's ``cluster_size``; 1 for a server alone): a client
    collects answers until it has this many or its deadline passes."""
    sizes = [1]
    for answer in answers:
        meta = _parts(answer)[1].get("meta_cluster")
        if isinstance(meta, Mapping) and isinstance(meta.get("cluster_size"), int):
            sizes.append(meta["cluster_size"])
    return max(sizes)


def servers_not_answering(answers: Sequence[Mapping[str, Any]]) -> list[str]:
    """The servers the answers' meta cluster names (its leader and
    replicas) that did not answer themselves, sorted: their settings are
    unchecked."""
    named: set[str] = set()
    for answer in answers:
        meta = _parts(answer)[1].get("meta_cluster")
        if not isinstance(meta, Mapping):
            continue
        if meta.get("leader"):
            named.add(str(meta["leader"]))
        for replica in meta.get("replicas") or []:
            if isinstance(replica, Mapping) and replica.get("name"):
                named.add(str(replica["name"]))
    return sorted(named - {_answer_name(answer) for answer in answers})


def check_stream_config(config: Mapping[str, Any]) -> list[str]:
    """The problems of a stream's configuration (as ``$JS.API.STREAM.INFO``
    returns it) for data that must survive a power cut: ``persist_mode:
    "async"`` turns syncing off for that stream whatever the server says."""
    if config.get("persist_mode") == "async":
        name = config.get("name", "?")
        return [
            f"JetStream stream {name} has persist_mode 'async': its writes are not "
            "synced even with sync_interval: always; recreate it with the default"
        ]
    return []
