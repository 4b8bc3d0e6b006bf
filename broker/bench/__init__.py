"""The project's own benchmarks, run by ``broker bench``.

Each suite module has ``run(quick: bool = False) -> dict[str, float | int]``.
"""
