"""The codebase's shape, as docs/architecture.md states it: no import cycles
(counting imports under ``TYPE_CHECKING`` and inside functions), a sans-IO
protocol package, and feature packages that keep their boundaries.

Imports are read from the source with :mod:`ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("accounts", "actors", "broker")

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


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


#: Sans-IO modules outside broker/protocol: the NATS client's protocol,
#: headers and JetStream codecs (its trio driver is ``_client.py``), the
#: checks of a NATS server's answers, and the cluster front ends' membership
#: table (its trio driver is ``_members_io.py``).
SANS_IO_MODULES = (
    "broker.nats._errors",
    "broker.nats._headers",
    "broker.nats._jetstream",
    "broker.nats._protocol",
    "broker.nats._server_checks",
    "broker.log._runs",
    "broker.server.cluster._members",
)

#: Sans-IO packages outside broker/protocol: every module of each.
SANS_IO_PACKAGES = ("broker.mqtt",)


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name in MODULES
        if name.startswith("broker.protocol")
        or name in SANS_IO_MODULES
        or any(_inside(name, package) for package in SANS_IO_PACKAGES)
    ),
)
def test_the_protocol_package_does_no_io(name: str) -> None:
    """broker/protocol (and the NATS client's protocol) is sans-IO: no event
    loop, sockets, files or clocks (time is passed in)."""
    roots = {target.split(".")[0] for target in _imported(name)}
    assert roots & SANS_IO_FORBIDDEN == set()


#: Feature packages and what each must not import, directly (docs/architecture.md).
MUST_NOT_IMPORT: dict[str, tuple[str, ...]] = {
    # Bytes on a stream know nothing of the broker's features.
    "broker.server.transport": (
        "broker.server.connection",
        "broker.server.cluster",
        "broker.server.topics",
        "broker.server._broker",
    ),
    # Frames are the wire format, below every state machine.
    "broker.protocol.frames": ("broker.protocol.connection", "broker.protocol.guarantees"),
    "broker.protocol.guarantees": ("broker.protocol.connection",),
    # The storage engine knows nothing of the server that uses it.
    "broker.log": ("broker.server",),
    # The NATS client knows nothing of the broker it serves.
    "broker.nats": ("broker.server", "broker.log", "broker.protocol", "broker.client"),
    # Topics see storage through the seam, never NATS.
    "broker.server.topics": ("broker.nats",),
    # A connection works the same in a single broker, in a worker and in a
    # cluster front end; what it needs of forwarding it names as a small
    # protocol, and storage is not its business.
    "broker.server.connection": ("broker.server.cluster", "broker.nats"),
    # The MQTT listener drives its own connections: it shares the broker's
    # topics, subscriptions and accounts, not the native connection's parts.
    "broker.server.mqtt": ("broker.server.connection", "broker.server.cluster", "broker.nats"),
    # MQTT's codec and state machine know the broker's topic rules only.
    "broker.mqtt": (
        "broker.server",
        "broker.log",
        "broker.client",
        "broker.nats",
        "broker.protocol.connection",
        "broker.protocol.frames",
        "broker.protocol.guarantees",
    ),
}


@pytest.mark.parametrize("package", sorted(MUST_NOT_IMPORT))
def test_feature_packages_keep_their_boundaries(package: str) -> None:
    """Each listed package imports none of the packages it must not know."""
    graph = _graph()
    crossing = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _inside(name, package)
        for target in targets
        if any(_inside(target, other) for other in MUST_NOT_IMPORT[package])
    )
    assert crossing == []


def test_the_boundary_check_sees_a_crossing() -> None:
    """The boundary test reads relative imports of subpackages correctly."""
    graph = _graph()
    assert "broker.server.cluster._link" in MODULES
    assert any(_inside(t, "broker.server.transport") for t in graph["broker.server.cluster._link"])
    assert any(
        _inside(t, "broker.server.topics") for t in graph["broker.server.connection._dispatch"]
    )


def test_every_package_says_what_it_holds() -> None:
    """A newcomer reads a package's ``__init__`` docstring as its table of contents."""
    silent = [
        name
        for name, (path, is_package) in MODULES.items()
        if is_package and ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert silent == []
