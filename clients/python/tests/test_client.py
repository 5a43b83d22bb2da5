"""The client against a real service: every RPC, the reservation blocks
(commit on a clean exit, refund on an error or without usage, background
lease renewal), denials as ``BudgetDenied`` with the HTTP answer, bearer
tokens, and the unavailable policy."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from conftest import Service, free_port
from ctxbudget import AsyncBudgetClient, BudgetClient, BudgetDenied, BudgetUnavailable, pb

CONFIG = """
[reservations]
default_lease_ttl_ms = 600
max_lease_ttl_ms = 60000
retry_jitter_ms = 0

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 100000, period = "1m" }] }
user = { requests = [{ limit = 5, period = "1d" }], tokens = [{ limit = 5000, period = "1d" }], concurrency = 2 }

[auth]
tokens = [{ name = "tests", token = "s3cret-token-for-tests" }]
"""
TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG)
    yield s
    s.stop()


def ask(user: str, **extra):
    return dict(tenant="acme", user=user, tier="t", model="gpt-4o", prompt_tokens=100, max_output_tokens=50, **extra)


def user_tokens_left(client: BudgetClient, user: str) -> int:
    status = client.get_status("acme", "t", user=user)
    return next(l.remaining for l in status.limits if l.level == pb.LEVEL_USER and l.dimension == pb.DIMENSION_TOKENS)


def test_a_clean_block_commits_the_usage_and_an_error_refunds(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        with c.reservation(**ask("u1")) as r:
            assert r.granted_max_output_tokens == 50
            assert r.headers["x-ratelimit-limit-requests"] == "5"
            r.set_usage(prompt_tokens=120, completion_tokens=30)
        assert r.settled.outcome == pb.OUTCOME_APPLIED
        assert r.settled.token_delta == 0, "150 reserved, 150 used"
        assert user_tokens_left(c, "u1") == 5000 - 150
        with pytest.raises(RuntimeError):
            with c.reservation(**ask("u1")) as r2:
                raise RuntimeError("upstream failed")
        assert r2.settled.outcome == pb.OUTCOME_APPLIED, "refunded"
        assert user_tokens_left(c, "u1") == 5000 - 150
        # No usage given: refunded too.
        with c.reservation(**ask("u1")) as r3:
            pass
        assert isinstance(r3.settled, pb.RefundResponse)


def test_a_denial_raises_budget_denied_with_the_http_answer(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        held = [c.check_and_reserve(**ask("u2")) for _ in range(2)]
        assert all(h.allowed for h in held)
        with pytest.raises(BudgetDenied) as e:
            with c.reservation(**ask("u2")):
                pytest.fail("the third concurrent call must not run")
        d = e.value
        assert d.reason == "REASON_CONCURRENCY_EXCEEDED"
        assert d.level == "LEVEL_USER"
        assert d.http_status == 429
        assert int(d.headers["Retry-After"]) >= 1
        assert d.response.allowed is False
        too_big = dict(ask("u2"), prompt_tokens=20000)
        with pytest.raises(BudgetDenied) as e:
            c.reservation(**too_big).__enter__()
        assert e.value.http_status == 413 and "Retry-After" not in e.value.headers
        for h in held:
            c.refund(h.reservation_id)


def test_a_long_block_keeps_its_lease_alive(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        # A 1.5 s lease held for 4 s: renewed every 500 ms (a renewal may run
        # up to a second late on a loaded machine and still keep it).
        with c.reservation(**ask("u3", lease_ttl_ms=1500)) as r:
            assert r.response.lease_expires_in_ms == 1500
            time.sleep(4.0)
            held = c.get_status("acme", "t", user="u3")
            slots = next(l for l in held.limits if l.level == pb.LEVEL_USER and l.dimension == pb.DIMENSION_CONCURRENCY)
            assert slots.remaining == 1, "the lease is live 4 s into a 1.5 s lease"
            r.set_usage(100, 10)
        assert r.settled.outcome == pb.OUTCOME_APPLIED, "not expired: the lease was renewed"


def test_the_async_client_does_the_same(service):
    async def run():
        async with AsyncBudgetClient(service.target, token=TOKEN) as c:
            async with c.reservation(**ask("u4", lease_ttl_ms=1500)) as r:
                await asyncio.sleep(3.5)
                r.set_usage(prompt_tokens=90, completion_tokens=10, cached_prompt_tokens=20)
            assert r.settled.outcome == pb.OUTCOME_APPLIED
            with pytest.raises(ValueError):
                async with c.reservation(**ask("u4")) as r2:
                    raise ValueError("stream broke")
            assert r2.settled.outcome == pb.OUTCOME_APPLIED
            status = await c.get_status("acme", "t", user="u4")
            left = next(l.remaining for l in status.limits if l.level == pb.LEVEL_USER and l.dimension == pb.DIMENSION_TOKENS)
            assert left == 5000 - 100
            est = await c.get_estimator("gpt-4o")
            assert any(k.key for k in est.keys), "the estimator reports its keys"

    asyncio.run(run())


def test_messages_are_counted_by_the_service(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        r = c.check_and_reserve(
            tenant="acme", user="u5", tier="t", model="gpt-4o", max_output_tokens=10,
            messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there, how are you?"}]}],
        )
        assert r.allowed and r.estimated_prompt_tokens > 0
        c.refund(r.reservation_id)


def test_a_wrong_token_is_refused(service):
    with BudgetClient(service.target, token="wrong") as c:
        with pytest.raises(grpc.RpcError) as e:
            c.check_and_reserve(**ask("u6"))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_unreachable_ctxbudget_follows_on_unavailable():
    nowhere = f"127.0.0.1:{free_port()}"
    with BudgetClient(nowhere, timeout=0.5) as c:
        with pytest.raises(BudgetUnavailable) as e:
            with c.reservation(**ask("u7")):
                pytest.fail("denied while unreachable")
        assert e.value.http_status == 503
    with BudgetClient(nowhere, timeout=0.5, on_unavailable="allow") as c:
        with c.reservation(**ask("u7")) as r:
            assert r.reservation_id is None and r.granted_max_output_tokens == 50
            r.set_usage(1, 1)
    with pytest.raises(ValueError):
        BudgetClient(nowhere, on_unavailable="maybe")
