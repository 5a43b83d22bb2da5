"""``limit_statuses`` through the real Python client (sync and async) and the
HTTP API: the caller chooses which limits' statuses an answer carries — all
(the default), the binding ones, or none — and the decision is the same."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Service

from ctxbudget import AsyncBudgetClient, BudgetClient
from ctxbudget.v1 import budget_pb2 as pb

CONFIG = """
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100, period = "1m" }], tokens = [{ limit = 1000, period = "1m" }] }
user = { requests = [{ limit = 2, period = "1m" }], tokens = [{ limit = 1000, period = "1m" }] }
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG, http=True)
    yield s
    s.stop()


def test_all_by_default_binding_or_none(service) -> None:
    with BudgetClient(service.target) as c:
        ask = {"tenant": "acme", "tier": "t", "prompt_tokens": 90, "max_output_tokens": 10}
        every = c.check_and_reserve(user="ann", **ask)
        assert every.allowed
        dimensions = {x.dimension for x in every.limits}
        assert len(every.limits) > len(dimensions) >= 2
        binding = c.check_and_reserve(user="bob", limit_statuses="binding", **ask)
        assert binding.allowed
        # One per dimension, the least room left: bob's requests (1 of 2
        # left), the tenant's tokens (800 of 1,000 against bob's 900).
        assert sorted(x.dimension for x in binding.limits) == sorted(dimensions)
        shown = {(x.level, x.dimension) for x in binding.limits}
        assert {(pb.LEVEL_TENANT, pb.DIMENSION_TOKENS), (pb.LEVEL_USER, pb.DIMENSION_REQUESTS)} <= shown
        none = c.check_and_reserve(user="cat", limit_statuses="none", **ask)
        assert none.allowed and none.reservation_id and not none.limits
        assert none.reserved_tokens == 100
        # Denied with none: the decision still says why and when to retry.
        c.check_and_reserve(user="cat", limit_statuses=pb.LIMIT_STATUSES_NONE, **ask)
        denied = c.check_and_reserve(user="cat", limit_statuses="none", **ask)
        assert not denied.allowed and not denied.limits
        assert (denied.reason, denied.limiting_level) == (pb.REASON_RPM_EXCEEDED, pb.LEVEL_USER)
        assert denied.retry_after_ms > 0
        with pytest.raises(ValueError, match="limit_statuses='few'"):
            c.check_and_reserve(user="dan", limit_statuses="few", **ask)  # type: ignore[arg-type]


def test_the_async_client_takes_it_too(service) -> None:
    async def run() -> int:
        async with AsyncBudgetClient(service.target) as c:
            r = await c.check_and_reserve(
                tenant="acme", user="eve", tier="t", prompt_tokens=90, max_output_tokens=10, limit_statuses="none"
            )
            assert r.allowed
            return len(r.limits)

    assert asyncio.run(run()) == 0


def test_the_http_api_takes_it_as_the_proto_does(service) -> None:
    ask = {"tenantId": "acme", "userId": "fay", "tier": "t", "promptTokens": "90", "maxOutputTokens": "10"}
    status, r = service.post_json("check-and-reserve", {**ask, "limitStatuses": "LIMIT_STATUSES_NONE"})
    assert status == 200 and r["allowed"] and not r.get("limits"), r
    status, r = service.post_json("check-and-reserve", {**ask, "limitStatuses": "LIMIT_STATUSES_BINDING"})
    assert status == 200 and len(r["limits"]) == len({x["dimension"] for x in r["limits"]}), r
    status, bad = service.post_json("check-and-reserve", {**ask, "limitStatuses": "LIMIT_STATUSES_SOME"})
    assert status == 400, bad
