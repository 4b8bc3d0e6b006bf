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
