"""A learned output reservation seen from the client: once a tier's
completions are learned, a reservation still grants the caller's
``max_output_tokens`` but reserves only the learned output, and
``reserved_prompt_tokens`` stays the prompt (a stream cut short commits it)."""

from __future__ import annotations

import time

import pytest

from conftest import Service
from ctxbudget import BudgetClient

CONFIG = """
[estimator]
output_min_samples = 20

# No global limits: a global level holds the whole grant (as an upstream
# that counts max_tokens does), so nothing less would be reserved.
[global]

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000000, period = "1d" }], output_reservation = "learned" }
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG)
    yield s
    s.stop()


def test_a_learned_tier_reserves_its_completions_quantile_not_the_max(service):
    ask = dict(tenant="acme", tier="t", model="gpt-4o", prompt_tokens=100, max_output_tokens=500)
    with BudgetClient(service.target) as c:
        first = c.reserve(**ask)
        assert (first.granted_max_output_tokens, first.reserved_output_tokens) == (500, 500)
        first.set_usage(100, 40)
        c.settle(first)
        for n in range(1, 20):
            r = c.reserve(**ask)
            r.set_usage(100, 40 + n)
            c.settle(r)
        # The service refreshes what it learned twice a second (a busy
        # machine may take longer).
        deadline = time.monotonic() + 20
        while not any(lo.tokens for k in c.get_estimator("gpt-4o").keys for lo in k.learned_outputs):
            assert time.monotonic() < deadline, "the learned output never showed"
            time.sleep(0.1)
        r = c.reserve(**ask)
        assert r.granted_max_output_tokens == 500, "the caller may still send its max upstream"
        assert r.reserved_output_tokens == 58, "the 0.95 quantile of 40..59"
        assert r.reserved_prompt_tokens == 100
        assert r.response is not None and r.response.reserved_tokens == 158
        c.settle(r, failed=True)
