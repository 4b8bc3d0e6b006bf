"""broker.protocol is sans-IO: importing it pulls in no trio, no sockets, no clock."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import broker.protocol

PACKAGE_DIR = Path(broker.protocol.__file__).parent
MODULES = sorted(PACKAGE_DIR.rglob("*.py"))


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_package_has_modules_to_check() -> None:
    names = {path.name for path in MODULES}
    assert {"__init__.py", "_decode.py", "_connection.py"} <= names


def test_importing_broker_protocol_does_not_import_trio() -> None:
    result = _run(
        "import sys\n"
        "import broker.protocol\n"
        "assert 'broker.protocol' in sys.modules\n"
        "leaked = sorted(m for m in sys.modules if m == 'trio' or m.startswith('trio.'))\n"
        "assert not leaked, leaked\n"
    )
    assert result.returncode == 0, result.stderr


def test_the_subprocess_check_can_fail() -> None:
    # The same check notices trio when it is imported, so the test above is meaningful.
    result = _run("import sys, trio\nassert 'trio' not in sys.modules\n")
    assert result.returncode != 0
    assert "AssertionError" in result.stderr


def test_no_module_mentions_import_trio() -> None:
    offenders = [
        str(path.relative_to(PACKAGE_DIR))
        for path in MODULES
        if "import trio" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_module_imports_io_frameworks_or_clocks() -> None:
    # Catches "from trio import ..." and friends that a plain text search would miss.
    forbidden = {"trio", "anyio", "asyncio", "socket", "ssl", "selectors", "time", "threading"}
    offenders = {
        str(path.relative_to(PACKAGE_DIR)): sorted(
            name for name in _imported_modules(path) if name.split(".")[0] in forbidden
        )
        for path in MODULES
    }
    assert {name: bad for name, bad in offenders.items() if bad} == {}
