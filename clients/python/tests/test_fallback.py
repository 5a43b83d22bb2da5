"""Fallback candidates through the Python client against a real service:
``candidate_models=`` reserves on the first model with room, the response
names it (``chosen_model``) and says why earlier ones were skipped; a denial
for every candidate raises ``BudgetDenied`` with the first one's reason."""

from __future__ import annotations

import pytest

from conftest import Service
from ctxbudget import BudgetClient, BudgetDenied, pb

CONFIG = """
[models.big]
match = ["big-*"]
global = { tokens = [{ limit = 300, period = "1h" }] }

[models.small]
match = ["small-*"]
global = { tokens = [{ limit = 150, period = "1h" }] }

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100, period = "1h" }] }
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG)
    yield s
    s.stop()


def test_the_first_candidate_with_room_is_reserved_and_named(service):
    ask = dict(tenant="acme", tier="t", prompt_tokens=100, max_output_tokens=50, candidate_models=["big-1", "small-1"])
    with BudgetClient(service.target) as c:
        chosen = []
        for _ in range(3):
            held = c.reserve(**ask)
            chosen.append(held.response.chosen_model)
            skipped = [(s.model, s.reason, s.level) for s in held.response.skipped_candidates]
        assert chosen == ["big-1", "big-1", "small-1"]
        assert skipped == [("big-1", pb.REASON_TPM_EXCEEDED, pb.LEVEL_GLOBAL)]
        with pytest.raises(BudgetDenied) as e:
            c.reserve(**ask)
        response = e.value.response
        assert response.limiting_model_group == "big", "the first candidate's denial"
        assert [s.model for s in response.skipped_candidates] == ["big-1", "small-1"]
        assert e.value.http_status == 429
        with pytest.raises(TypeError, match="list of model names"):
            c.reserve(**{**ask, "candidate_models": "big-1"})
