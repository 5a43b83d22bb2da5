"""``max_wait_ms`` through the real Python client (sync and async) and the
HTTP API: a call that only the shared upstream account denies waits in line
and is granted when a Refund returns the room; ``waited_ms`` says how long
it waited. Without ``timeout=``, the client's deadline covers the wait."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import Service

from ctxbudget import AsyncBudgetClient, BudgetClient
from ctxbudget.v1 import budget_pb2 as pb

CONFIG = """
[global]
concurrency = 1

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { concurrency = 100 }
user = { concurrency = 100 }
"""

ASK = {"tier": "t", "prompt_tokens": 10, "max_output_tokens": 10}


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG, http=True)
    yield s
    s.stop()


def test_a_wait_longer_than_the_clients_deadline_is_granted_on_a_refund(service) -> None:
    with BudgetClient(service.target, timeout=1.0) as c:
        held = c.check_and_reserve(tenant="a", user="u", **ASK)
        assert held.allowed
        at_once = c.check_and_reserve(tenant="b", user="u", **ASK)
        assert not at_once.allowed and at_once.limiting_level == pb.LEVEL_GLOBAL
        assert at_once.waited_ms == 0
        # The refund comes after the client's own 1 s deadline: the wait is
        # covered by max_wait_ms, not cut by it.
        threading.Timer(1.5, lambda: c.refund(held.reservation_id)).start()
        started = time.monotonic()
        out = c.check_and_reserve(tenant="b", user="u", max_wait_ms=8000, **ASK)
        took = time.monotonic() - started
        assert out.allowed, out
        assert 1300 <= out.waited_ms <= took * 1000 + 50, (out.waited_ms, took)
        c.refund(out.reservation_id)


def test_the_async_client_waits_too(service) -> None:
    async def run() -> pb.CheckAndReserveResponse:
        async with AsyncBudgetClient(service.target) as c:
            held = await c.check_and_reserve(tenant="a", user="v", **ASK)
            assert held.allowed
            waiting = asyncio.ensure_future(c.check_and_reserve(tenant="c", user="v", max_wait_ms=8000, **ASK))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await c.refund(held.reservation_id)
            out = await waiting
            await c.refund(out.reservation_id)
            return out

    out = asyncio.run(run())
    assert out.allowed and out.waited_ms >= 250, out


def test_the_http_api_takes_max_wait_ms(service) -> None:
    with BudgetClient(service.target) as c:
        held = c.check_and_reserve(tenant="a", user="w", **ASK)
        assert held.allowed
        ask = {"tenantId": "d", "userId": "w", "tier": "t", "promptTokens": "10", "maxOutputTokens": "10"}
        started = time.monotonic()
        status, r = service.post_json("check-and-reserve", {**ask, "maxWaitMs": "300"})
        assert status == 429 and not r["allowed"], r
        assert int(r["waitedMs"]) >= 300 and time.monotonic() - started >= 0.3, r
        assert r["limitingLevel"] == "LEVEL_GLOBAL" and int(r["retryAfterMs"]) > 0, r
        status, bad = service.post_json("check-and-reserve", {**ask, "maxWaitMs": "600001"})
        assert status == 400 and "max_wait_ms" in bad["error"]["message"], bad
        c.refund(held.reservation_id)
