"""The project's own benchmarks, run by ``broker bench``.

Each suite module has ``run(quick: bool = False) -> dict[str, Any]``; a
suite that needs other software also has ``unavailable() -> str | None``
(one line saying what to install, or None), and one with its own layout
``table(results) -> list[str]``.
"""
