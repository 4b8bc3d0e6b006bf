"""The codebase's shape, as docs/architecture.md states it: no import cycles
(counting imports under ``TYPE_CHECKING`` and inside functions), a sans-IO
protocol package, and modules of a reviewable size.

Imports are read from the source with :mod:`ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("accounts", "actors", "broker")

#: The size past which a module needs a stated reason (docs/architecture.md).
MAX_LINES = 600
#: Modules allowed past MAX_LINES, and why.
LONG_MODULES: dict[str, str] = {
    "broker/server/_connection.py": (
        "one connection's I/O driver (reader, writer, keepalive and their "
        "pauses): one job, whose loops share the connection's state"
    ),
    "broker/log/_log.py": (
        "TopicLog: one topic's log, one job (append, read with gaps, sync, "
        "retention, its files' bound); split by line count it would scatter "
        "that state over classes that share every field"
    ),
    "broker/server/_broker.py": (
        "Broker: the broker's shared state and its serve loop, one job; the "
        "package-by-feature issue moves its parts to their features"
    ),
    "broker/client/_core.py": (
        "ClientSession: the sans-IO session both clients drive, one state "
        "machine (handshake, resume, subscriptions, acknowledgements)"
    ),
    "broker/server/_groups.py": (
        "consumer groups on the broker: a group's dispatch, dead letters and "
        "journal state share every field of the group"
    ),
    "broker/groups/_state.py": (
        "GroupState: one group's bookkeeping, one state machine (dispatch, "
        "settling, expiry, order per key, snapshot) over the same records"
    ),
    "broker/protocol/_messages.py": (
        "the wire messages: one dataclass per frame type, the list that is "
        "the protocol's vocabulary; split by size it would scatter it"
    ),
    "broker/protocol/_codec.py": (
        "the decoder: one check per message type, the table that maps codes "
        "to them; splitting it would scatter the wire format"
    ),
    "broker/protocol/_encode.py": (
        "the encoder: one layout per message type and the shared-tail frame "
        "heads; the counterpart of _codec, line for line"
    ),
    "broker/protocol/_traffic.py": (
        "Traffic: a connection's channel traffic (publish, the four deliver "
        "frames, acks, gaps, confirms, settles) over one guarantee state"
    ),
    "broker/server/_link.py": (
        "Link: one worker's connection to a topic's owner, one job (its topics, "
        "forwarded subscriptions and group members over one client connection)"
    ),
    "broker/server/_topic.py": (
        "Topic: one topic actor and the queues it routes into; a batch's way "
        "from a publish to its log and subscriptions (appended, held for "
        "room, gathered for the journal, waiting for its fsync) shares its state"
    ),
    "broker/server/_staging.py": (
        "StagingArea: staged batches, their commits and how they survive a "
        "restart; one state machine whose journal restore must mirror staging "
        "and committing line for line"
    ),
}

#: Modules of broker/protocol may import only these (plus the standard
#: library modules that do no I/O and read no clock, and each other).
SANS_IO_FORBIDDEN = {"trio", "socket", "ssl", "select", "time", "asyncio", "threading", "os"}


def _modules() -> dict[str, tuple[Path, bool]]:
    modules: dict[str, tuple[Path, bool]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            modules[".".join(parts)] = (path, is_package)
    return modules


MODULES = _modules()


def _imported(name: str) -> Iterator[str]:
    """Every module ``name`` imports, wherever the import statement is."""
    path, is_package = MODULES[name]
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names]
            if not all(name in MODULES for name in submodules):
                yield target  # names from the module itself, not only its submodules
            yield from submodules
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


def _graph() -> dict[str, set[str]]:
    return {
        name: {target for target in _imported(name) if target in MODULES and target != name}
        for name in MODULES
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    """No import cycle anywhere, not even through TYPE_CHECKING or a
    function-level import: each module can be read and changed knowing only
    what it imports."""
    assert _cycles(_graph()) == []


@pytest.mark.parametrize(
    "name", sorted(name for name in MODULES if name.startswith("broker.protocol"))
)
def test_the_protocol_package_does_no_io(name: str) -> None:
    """broker/protocol is sans-IO: no event loop, sockets, files or clocks
    (time is passed in)."""
    roots = {target.split(".")[0] for target in _imported(name)}
    assert roots & SANS_IO_FORBIDDEN == set()


def test_modules_stay_reviewable() -> None:
    """No module over MAX_LINES lines without a reason in LONG_MODULES."""
    long = {}
    for path, _ in MODULES.values():
        relative = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and relative not in LONG_MODULES:
            long[relative] = lines
    assert long == {}
    stale = [name for name in LONG_MODULES if not (ROOT / name).exists()]
    assert stale == []
