"""The session level through the client, against a real service: a tier's
``session`` limits apply to one session (an agent run) of a user, beside the
user's; a denial there names ``LEVEL_SESSION`` ("session") and feeds the
HTTP headers; another session of the same user, the same session id under
another user, and a call naming no session are not held by it; GetStatus
shows a session's entries; a malformed session id is refused clearly."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Service

from ctxbudget import AsyncBudgetClient, BudgetClient, BudgetDenied, BudgetInvalidArgument, http_status_and_headers, pb

CONFIG = """
[tiers.s]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 100000, window = "day" }] }
user = { requests = [{ limit = 100, period = "1h" }] }
session = { requests = [{ limit = 2, period = "1h" }] }
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG)
    yield s
    s.stop()


def ask(user: str, **extra):
    return dict(tenant="acme", user=user, tier="s", prompt_tokens=10, max_output_tokens=5, **extra)


def entries(status: pb.GetStatusResponse, level: int) -> list[tuple[int, int, int]]:
    """(dimension, limit, remaining) of each entry of ``level``."""
    return [(e.dimension, e.limit, e.remaining) for e in status.limits if e.level == level]


def test_a_sessions_limit_denies_at_the_session_level_and_no_other_session(service):
    with BudgetClient(service.target) as c:
        held = [c.check_and_reserve(**ask("u1", session="run-1")) for _ in range(2)]
        assert all(h.allowed for h in held)
        third = c.check_and_reserve(**ask("u1", session="run-1"))
        assert not third.allowed
        assert third.limiting_level == pb.LEVEL_SESSION and third.reason == pb.REASON_RPM_EXCEEDED
        assert "session" in third.detail, third.detail
        with pytest.raises(BudgetDenied) as e:
            c.reserve(**ask("u1", session_id="run-1"))
        d = e.value
        assert (d.level, d.level_name, d.http_status) == ("LEVEL_SESSION", "session", 429)
        # The headers show the session's limit: the one that denied.
        assert d.headers["x-ratelimit-limit-requests"] == "2" and d.headers["x-ratelimit-remaining-requests"] == "0", d.headers
        assert int(d.headers["Retry-After"]) >= 1
        # The same user in another session, the same session id of another
        # user, and the user's calls that name no session: all still pass.
        for other in (ask("u1", session="run-2"), ask("u2", session="run-1"), ask("u1")):
            r = c.check_and_reserve(**other)
            assert r.allowed, (other, r.detail)
            c.refund(r.reservation_id)
        # A refund gives the session its request back.
        c.refund(held[0].reservation_id)
        again = c.check_and_reserve(**ask("u1", session="run-1"))
        assert again.allowed, again.detail
        for r in (held[1], again):
            c.refund(r.reservation_id)


def test_an_allowed_calls_headers_show_the_session_when_it_is_the_tightest(service):
    with BudgetClient(service.target) as c:
        r = c.check_and_reserve(**ask("u3", session="run-1"))
        status, headers = http_status_and_headers(r)
        assert status == 200
        # Session 1 of 2 left beats the user's 99 of 100.
        assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == ("2", "1"), headers
        c.refund(r.reservation_id)


def test_get_status_shows_a_sessions_limits(service):
    with BudgetClient(service.target) as c:
        r = c.check_and_reserve(**ask("u4", session="run-1"))
        status = c.get_status("acme", "s", user="u4", session="run-1")
        assert entries(status, pb.LEVEL_SESSION) == [(pb.DIMENSION_REQUESTS, 2, 1)]
        assert entries(status, pb.LEVEL_USER) == [(pb.DIMENSION_REQUESTS, 100, 99)]
        assert entries(c.get_status("acme", "s", user="u4", session="run-2"), pb.LEVEL_SESSION) == [(pb.DIMENSION_REQUESTS, 2, 2)]
        assert entries(c.get_status("acme", "s", user="u4"), pb.LEVEL_SESSION) == [], "no session named: no session level"
        c.refund(r.reservation_id)

    async def run():
        async with AsyncBudgetClient(service.target) as a:
            held = await a.check_and_reserve(**ask("u5", session_id="run-a"))
            status = await a.get_status("acme", "s", user="u5", session="run-a")
            assert entries(status, pb.LEVEL_SESSION) == [(pb.DIMENSION_REQUESTS, 2, 1)]
            async with a.reservation(**ask("u5", session="run-a")) as r:
                r.set_usage(10, 5)
            with pytest.raises(BudgetDenied) as e:
                await a.reserve(**ask("u5", session="run-a"))
            assert e.value.level_name == "session"
            await a.refund(held.reservation_id)

    asyncio.run(run())


def test_a_malformed_session_id_is_refused_clearly(service):
    with BudgetClient(service.target) as c:
        for bad in ("run\t1", "run\n1", "x" * 257):
            with pytest.raises(BudgetInvalidArgument) as e:
                c.check_and_reserve(**ask("u6", session=bad))
            assert e.value.details.startswith("session_id:") and e.value.http_status == 400, e.value.details
        with pytest.raises(BudgetInvalidArgument, match="session_id: contains the control character"):
            c.get_status("acme", "s", user="u6", session="run\x001")
        # Not a string: a TypeError naming the field, before any call.
        for fields in (ask("u6", session=42), ask("u6", session_id=b"run-1")):
            with pytest.raises(TypeError, match=r"session(_id)?=.*an id is a str"):
                c.check_and_reserve(**fields)
        with pytest.raises(TypeError, match="session=42"):
            c.get_status("acme", "s", session=42)
        with pytest.raises(TypeError, match="user=7"):
            c.check_and_reserve(**ask(7))
        with pytest.raises(TypeError, match="pass one of them"):
            c.check_and_reserve(**ask("u6", session="a", session_id="b"))
        with pytest.raises(TypeError, match="the fields are .*session_id"):
            c.check_and_reserve(**ask("u6", sesion="a"))
        assert entries(c.get_status("acme", "s", user="u6"), pb.LEVEL_USER) == [(pb.DIMENSION_REQUESTS, 100, 100)], "nothing charged"
