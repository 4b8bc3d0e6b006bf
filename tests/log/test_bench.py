"""The benchmark script runs and prints every figure (its speed is not checked)."""

from __future__ import annotations

import pytest

from broker.log import _bench


def test_the_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    _bench.main(["3000"])
    out = capsys.readouterr().out
    assert out.count("python_loop_10m_s") == 2
    labels = ("append, batch", "reopen", "replay from mapped files", "writing process", "always")
    for label in labels:
        assert label in out
    assert "records/s" in out and "MB/s" in out
