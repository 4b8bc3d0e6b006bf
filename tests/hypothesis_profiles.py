"""The property tests' example counts under the loaded Hypothesis profile.

tests/conftest.py registers two profiles: "ci", loaded by default (CI and the
README's command), and "dev" (``--hypothesis-profile=dev``), a tenth of the
examples for a quicker run while changing code. A test that sets its own
``max_examples`` would override either: it asks ``examples(n)`` instead, which
is ``n`` under "ci" and as many times fewer under "dev"."""

from __future__ import annotations

from hypothesis import settings


def examples(ci: int, at_least: int = 1) -> int:
    """``ci`` (a test's example count under the "ci" profile), scaled by the
    loaded profile's ``max_examples`` against the "ci" profile's, but not below
    ``at_least`` (nor above ``ci``): a state machine test that asserts, after
    its run, that the run reached some state needs enough examples to reach it
    every time (25 examples of a test asking for 250 missed one in five runs)."""
    scaled = ci * settings.default.max_examples // settings.get_profile("ci").max_examples
    return max(scaled, min(at_least, ci), 1)
