"""Test-wide fixtures: every test runs with loan-leak detection on, and fails
if the garbage collector had to repay a loan that the code under test lost."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

import accounts

accounts.set_leak_detection(True)

# Property tests check behaviour, not speed: no per-example deadline (the
# default 200 ms fails on a loaded or slower machine). "ci", the default, runs
# Hypothesis's example counts (and those the tests set); "dev", chosen with
# `--hypothesis-profile=dev`, a tenth of them for a quicker run while changing
# code (tests that set max_examples scale theirs with
# tests.hypothesis_profiles.examples). Our "ci" replaces Hypothesis's own,
# which Hypothesis loads by itself when $CI is set: ours then inherits its
# settings, as the one profile this file registered before did.
settings.register_profile("ci", deadline=None)
settings.register_profile("dev", settings.get_profile("ci"), max_examples=10)
settings.load_profile("ci")

# A `broker serve` a test starts without --data-dir or --memory-only would use
# the default data directory (~/.local/state/broker), which a test run going
# on beside this one may hold locked: point the default into a directory of
# this run's own instead (tests start their brokers memory-only or on a
# directory of their own; this only keeps a forgotten one off the shared one).
_STATE_HOME = tempfile.mkdtemp(prefix="broker-tests-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
os.environ.pop("STATE_DIRECTORY", None)
# The broker's own environment variables of the shell running the tests (a
# BROKER_LISTEN, BROKER_TOKEN or BROKER_CONFIG of a developer's) would change
# what the brokers and clients the tests start do: the tests set their own.
# BROKER_REQUIRE_TOOLS is the tests' own switch (CI sets it), not the broker's.
for _name in [n for n in os.environ if n.startswith("BROKER_") and n != "BROKER_REQUIRE_TOOLS"]:
    del os.environ[_name]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The suite runs in two worker processes (pytest-xdist: addopts in
    pyproject.toml), each given whole test files (``--dist loadfile``): a
    module-scoped fixture (a cluster of servers, say) starts once. The Spark
    tests (tests/spark/) go to one worker together: they share one JVM and the
    brokers of their session-scoped fixtures. (``--dist loadgroup`` with
    ``xdist_group`` marks would say this, but pytest-xdist 3.8 under pytest 9.2
    ignores the marks: pytest-xdist issue #1386.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndSpark(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/spark/" if path.startswith("tests/spark/") else path

    return FilesAndSpark(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_STATE_HOME, ignore_errors=True)


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``nats-server`` (JetStream, every write synced) for the module
    that asks for it (skipped, saying what to install, without one)."""
    from broker.nats._servers import open_nats_servers

    from .nats.raw import require_nats_server

    require_nats_server()
    with open_nats_servers(tmp_path_factory.mktemp("nats"), count=1) as servers:
        yield servers.urls[0]


@pytest.fixture(autouse=True)
def _no_leaked_loans() -> Iterator[None]:
    before = accounts.leaked_loans()
    yield
    gc.collect()
    leaked = accounts.leaked_loans() - before
    assert leaked == 0, f"{leaked} loan(s) were garbage-collected without being repaid"
