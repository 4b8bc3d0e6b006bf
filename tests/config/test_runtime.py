"""Process tuning: the garbage collector settings ``broker serve`` applies."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from broker.config import BrokerConfig, ConfigError
from broker.runtime import tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_a_threshold_is_applied_and_start_up_objects_frozen(restored_gc: None) -> None:
    _, older, oldest = gc.get_threshold()
    tune_gc(12_345)
    assert gc.get_threshold() == (12_345, older, oldest)
    assert gc.get_freeze_count() > 0


def test_zero_leaves_python_alone(restored_gc: None) -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    tune_gc(0)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == frozen


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError):
        tune_gc(-1)
    with pytest.raises(ConfigError, match="gc_threshold"):
        BrokerConfig(gc_threshold=-1)


def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    """A broker with a data directory keeps a file open per topic log."""
    import resource
    import subprocess
    import sys

    code = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from broker.runtime import raise_open_file_limit\n"
        "limit = raise_open_file_limit()\n"
        "print(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    limit, soft, hard = (int(x) for x in out.stdout.split())
    assert limit == soft
    if hard != resource.RLIM_INFINITY:
        assert soft == hard
