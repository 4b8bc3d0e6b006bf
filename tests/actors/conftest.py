from __future__ import annotations

import pytest

from accounts import Account


@pytest.fixture
def account() -> Account:
    return Account("test", high_watermark=1000, low_watermark=500, event_cost=1)
