"""The server's seams stay: its parts and the metrics name small protocols,
not the connection or the broker. (Import circles and module sizes are
checked for every package by tests/test_architecture.py.)

Parsed with ``ast`` (nothing is imported), so a violation names its module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker/server", "broker/metrics")
#: Who may name ``ServerConnection`` (from ``_connection``): the package's
#: front, and the broker, which creates and drives connections.
MAY_NAME_CONNECTION = {
    "broker.server",
    "broker.server._broker",
    "broker.server.connection._connection",
}
#: Who may name ``Broker`` (from ``_broker``): the package's front, and the
#: metrics' entry points, which are handed the broker (``BrokerCollector(broker)``).
MAY_NAME_BROKER = {
    "broker.server",
    "broker.server._broker",
    "broker.server._front_end",  # (cluster mode: serves one broker after another)
    "broker.metrics._collector",
    "broker.metrics._http",
    "broker.metrics._stat",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path) -> list[tuple[str, str]]:
    """``(module, imported name)`` of every ``from ... import`` in ``path``,
    ``TYPE_CHECKING`` blocks included, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [(module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names]
    return found


MODULES = _modules()
IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def _names(module: str, imported: str) -> set[str]:
    """The modules in ``IMPORTS`` that import ``imported`` from ``module``
    (or from the package front, which re-exports it)."""
    fronts = {module.rpartition(".")[0], module.split("._")[0].rpartition(".")[0]}
    fronts |= {".".join(module.split(".")[:2])}
    return {
        name
        for name, imports in IMPORTS.items()
        if any(m in {module} | fronts and n == imported for m, n in imports)
    }


def test_the_modules_are_found() -> None:
    assert "broker.server.connection._connection" in MODULES
    assert "broker.metrics._connection_figures" in MODULES


def test_only_the_broker_names_the_connection_class() -> None:
    naming = _names("broker.server.connection._connection", "ServerConnection")
    assert naming <= MAY_NAME_CONNECTION, sorted(naming - MAY_NAME_CONNECTION)


def test_only_the_entry_points_name_the_broker_class() -> None:
    naming = _names("broker.server._broker", "Broker")
    assert naming <= MAY_NAME_BROKER, sorted(naming - MAY_NAME_BROKER)


def test_no_module_imports_the_connection_or_broker_module_but_their_drivers() -> None:
    """Not even for a constant: the leaf modules depend on protocols."""
    for target, allowed in (
        ("broker.server.connection._connection", MAY_NAME_CONNECTION),
        ("broker.server._broker", MAY_NAME_BROKER),
    ):
        importing = {
            name for name, imports in IMPORTS.items() if any(m == target for m, _ in imports)
        }
        assert importing <= allowed, (target, sorted(importing - allowed))
