"""Images per minute through the real Python client (sync and async): a
reservation says how many images the call may generate (``images=``), a
denial names the image limit, and a Commit says how many it generated —
from ``commit(images=)`` or from ``set_usage(images=)`` in a
``reservation()`` block — each charged at the group's ``image`` price."""

from __future__ import annotations

import asyncio

import pytest
from conftest import Service

from ctxbudget import AsyncBudgetClient, BudgetClient, BudgetDenied
from ctxbudget.v1 import budget_pb2 as pb

CONFIG = """
[models.dall-e]
match = ["dall-e-*"]

[prices.dall-e]
input = 0.0
output = 0.0
image = 0.04

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
user = { images = [{ limit = 5, period = "1h" }] }
"""


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG, http=True)
    yield s
    s.stop()


def images_left(c: BudgetClient, user: str) -> int:
    s = c.get_status("acme", "t", user, "dall-e-3")
    (limit,) = [x for x in s.limits if x.dimension == pb.DIMENSION_IMAGES]
    return limit.remaining


def test_images_are_reserved_denied_and_committed(service) -> None:
    with BudgetClient(service.target) as c:
        r = c.check_and_reserve(tenant="acme", user="ann", tier="t", model="dall-e-3", prompt_tokens=30, images=4)
        assert r.allowed
        assert images_left(c, "ann") == 1
        denied = c.check_and_reserve(tenant="acme", user="ann", tier="t", model="dall-e-3", prompt_tokens=30, images=2)
        assert not denied.allowed
        assert denied.reason == pb.REASON_IMAGES_EXCEEDED
        assert denied.limiting_dimension == pb.DIMENSION_IMAGES
        assert denied.retry_after_ms > 0
        done = c.commit(r.reservation_id, 30, 0, images=3)
        assert done.cost_micros == 3 * 40_000
        assert images_left(c, "ann") == 2
        with pytest.raises(TypeError, match="imagez"):
            c.commit(r.reservation_id, 30, 0, imagez=3)  # type: ignore[call-arg]


def test_a_reservation_block_commits_the_images_set_with_the_usage(service) -> None:
    with BudgetClient(service.target) as c:
        with c.reservation(tenant="acme", user="bo", tier="t", model="dall-e-3", prompt_tokens=30, images=5) as r:
            r.set_usage(30, 0, images=1)
        assert images_left(c, "bo") == 4
        with pytest.raises(BudgetDenied) as e:
            with c.reservation(tenant="acme", user="bo", tier="t", model="dall-e-3", prompt_tokens=30, images=5):
                pass
        assert e.value.response.reason == pb.REASON_IMAGES_EXCEEDED
        assert (e.value.reason, e.value.http_status) == ("REASON_IMAGES_EXCEEDED", 429)


def test_the_async_client_commits_images(service) -> None:
    async def run() -> int:
        async with AsyncBudgetClient(service.target) as c:
            r = await c.check_and_reserve(tenant="acme", user="cy", tier="t", model="dall-e-3", prompt_tokens=30, images=2)
            assert r.allowed
            done = await c.commit(r.reservation_id, 30, 0, images=2)
            return done.cost_micros

    assert asyncio.run(run()) == 2 * 40_000


def test_the_http_api_takes_images_as_the_proto_does(service) -> None:
    ask = {"tenantId": "acme", "userId": "dee", "tier": "t", "model": "dall-e-3", "promptTokens": "30"}
    status, r = service.post_json("check-and-reserve", {**ask, "images": "5"})
    assert status == 200 and r["allowed"], r
    status, denied = service.post_json("check-and-reserve", {**ask, "images": "1"})
    assert status == 429, denied
    assert (denied["reason"], denied["limitingDimension"]) == ("REASON_IMAGES_EXCEEDED", "DIMENSION_IMAGES")
    status, done = service.post_json("commit", {"reservationId": r["reservationId"], "promptTokens": "30", "images": "5"})
    assert status == 200 and done["costMicros"] == str(5 * 40_000), done
