"""Commit's billed parts through the real client: cache writes and reasoning
priced at the model group's prices; parts above their whole refused."""

from __future__ import annotations

import pytest
from conftest import Service

from ctxbudget import BudgetClient, BudgetInvalidArgument

CONFIG = """
[models.sonnet]
match = ["claude-sonnet*"]

[prices.sonnet]
input = 3.00
cache_write = 3.75
cache_write_1h = 6.00
output = 15.00
reasoning = 30.00

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 100
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG)
    yield s
    s.stop()


def test_commit_prices_cache_writes_and_reasoning(service) -> None:
    with BudgetClient(service.target) as c:
        r = c.check_and_reserve(tenant="acme", tier="t", model="claude-sonnet-4", prompt_tokens=10_000, max_output_tokens=1_000)
        assert r.allowed
        with pytest.raises(BudgetInvalidArgument, match="cache_write_1h_prompt_tokens"):
            c.commit(r.reservation_id, 10_000, 1_000, cache_write_prompt_tokens=6_000, cache_write_1h_prompt_tokens=5_000)
        done = c.commit(
            r.reservation_id, 10_000, 1_000,
            cache_write_prompt_tokens=2_000, cache_write_1h_prompt_tokens=1_000, reasoning_tokens=400,
        )
        # 7,000 × $3 + 2,000 × $3.75 + 1,000 × $6 per million; 600 × $15 + 400 × $30.
        assert done.cost_micros == 21_000 + 7_500 + 6_000 + 9_000 + 12_000
