"""The client against a real service: every RPC, the reservation blocks
(commit on a clean exit, refund on an error or without usage, commit of what
a stream delivered, background lease renewal), denials as ``BudgetDenied``
with the HTTP answer, every error a ``BudgetError``, bearer tokens, the
fields by either name, and the unavailable policy."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time

import grpc
import pytest

from conftest import REPO, Service, free_port
from ctxbudget import (
    AsyncBudgetClient,
    BudgetClient,
    BudgetDenied,
    BudgetError,
    BudgetInvalidArgument,
    BudgetNotFound,
    BudgetPermissionDenied,
    BudgetUnavailable,
    pb,
)

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
tokens = [
  { name = "tests", token = "s3cret-token-for-tests" },
  { name = "other", token = "s3cret-token-of-another", tenants = ["other"] },
]
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
        with pytest.raises(BudgetPermissionDenied) as e:
            c.check_and_reserve(**ask("u6"))
        assert e.value.code == "UNAUTHENTICATED"


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
        # No cap asked: none to send upstream (not max_tokens = 0).
        with c.reservation(tenant="acme", tier="t", prompt_tokens=10) as r:
            assert r.reservation_id is None and r.granted_max_output_tokens is None
    with pytest.raises(ValueError):
        BudgetClient(nowhere, on_unavailable="maybe")


def test_every_error_is_a_budget_error_with_its_code(service):
    """No grpc.RpcError escapes: each RPC's failure is a BudgetError subclass
    carrying the gRPC status name and the service's message."""
    with BudgetClient(service.target, token=TOKEN) as c:
        calls = {
            "commit": (lambda: c.commit("not-an-id", 1, 1), BudgetInvalidArgument, "INVALID_ARGUMENT"),
            "refund": (lambda: c.refund("not-an-id"), BudgetInvalidArgument, "INVALID_ARGUMENT"),
            "renew_lease": (lambda: c.renew_lease("not-an-id"), BudgetInvalidArgument, "INVALID_ARGUMENT"),
            "get_status": (lambda: c.get_status("acme", "no-such-tier"), BudgetInvalidArgument, "INVALID_ARGUMENT"),
            "check_and_reserve": (lambda: c.check_and_reserve(**dict(ask("u8"), tier="no-such-tier")),
                                  BudgetInvalidArgument, "INVALID_ARGUMENT"),
            "reservation": (lambda: c.reservation(**dict(ask("u8"), tenant="bad\ttenant")).__enter__(),
                            BudgetInvalidArgument, "INVALID_ARGUMENT"),
        }
        for name, (call, cls, code) in calls.items():
            with pytest.raises(BudgetError) as e:
                call()
            assert type(e.value) is cls and e.value.code == code, (name, e.value)
            assert not isinstance(e.value, grpc.RpcError) and e.value.details, name
            assert e.value.http_status == 400, name
        # A well-formed id never issued.
        held = c.check_and_reserve(**ask("u8"))
        body = held.reservation_id.removeprefix("rsv_")
        raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        raw[-1] ^= 1
        never = "rsv_" + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        with pytest.raises(BudgetNotFound) as e:
            c.refund(never)
        assert e.value.code == "NOT_FOUND"
        # An idempotency key whose reservation is settled.
        first = c.check_and_reserve(**ask("u8", idempotency_key="k-1"))
        c.refund(first.reservation_id)
        c.refund(held.reservation_id)
        with pytest.raises(BudgetError) as e:
            c.check_and_reserve(**ask("u8", idempotency_key="k-1"))
        assert e.value.code == "FAILED_PRECONDITION" and e.value.http_status == 400
    with BudgetClient(service.target, token="s3cret-token-of-another") as c:
        with pytest.raises(BudgetPermissionDenied) as e:
            c.get_status("acme", "t")
        assert e.value.code == "PERMISSION_DENIED"
    with BudgetClient(f"127.0.0.1:{free_port()}", timeout=0.5) as c:
        with pytest.raises(BudgetUnavailable) as e:
            c.commit(held.reservation_id, 1, 1)
        assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") and e.value.http_status == 503

    async def run():
        async with AsyncBudgetClient(service.target, token=TOKEN) as c:
            with pytest.raises(BudgetInvalidArgument):
                await c.refund("not-an-id")
            with pytest.raises(BudgetNotFound):
                await c.commit(never, 1, 1)
            with pytest.raises(BudgetInvalidArgument):
                await c.get_status("acme", "no-such-tier")

    asyncio.run(run())


def test_fields_go_by_the_protos_names_too(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        r = c.check_and_reserve(tenant_id="acme", user_id="u9", tier="t", prompt_tokens=10, max_output_tokens=5)
        assert r.allowed
        c.refund(r.reservation_id)
        with c.reservation(tenant_id="acme", user_id="u9", tier="t", prompt_tokens=10, max_output_tokens=5) as held:
            held.set_usage(10, 5)
        assert user_tokens_left(c, "u9") == 5000 - 15, "the user_id= user was charged"
        with pytest.raises(TypeError, match="tenant_id"):
            c.check_and_reserve(tenant="acme", tenant_id="other", tier="t", prompt_tokens=10)
        with pytest.raises(TypeError, match="the fields are .*tenant_id"):
            c.check_and_reserve(tenantid="acme", tier="t", prompt_tokens=10)


def test_a_type_checker_catches_a_misspelled_field(tmp_path):
    """mypy, against the package's annotations: the names are typed, a
    misspelled one (or a priority that does not exist) is an error."""
    snippet = tmp_path / "use.py"
    snippet.write_text(
        "from ctxbudget import AsyncBudgetClient, BudgetClient\n"
        "c = BudgetClient('127.0.0.1:1')\n"
        "c.check_and_reserve(tenant_id='a', user_id='u', tier='t', prompt_tokens=1, priority='batch')\n"
        "c.check_and_reserve(tenantid='a', tier='t', prompt_tokens=1)\n"
        "with c.reservation(tenant='a', tier='t', prompt_token=1) as r:\n"
        "    pass\n"
        "async def f(a: AsyncBudgetClient) -> None:\n"
        "    await a.reserve(tenant='a', tier='t', prompt='x', priority='urgent')\n"
    )
    mypy = os.path.join(os.path.dirname(sys.executable), "mypy")
    out = subprocess.run([mypy, "--strict", "--cache-dir", str(tmp_path / "cache"), str(snippet)],
                         capture_output=True, text=True, cwd=REPO).stdout
    errors = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert errors == {4, 5, 8}, out
    assert 'Unexpected keyword argument "tenantid"' in out and 'did you mean "tenant_id"' in out


def test_a_priority_or_timeout_that_cannot_work_is_refused(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        with pytest.raises(ValueError, match="'critical', 'normal', 'batch'"):
            c.check_and_reserve(**ask("u10", priority="urgent"))
        with pytest.raises(ValueError, match="priority=42"):
            c.check_and_reserve(**ask("u10", priority=42))
        r = c.check_and_reserve(**ask("u10", priority="critical"))
        assert r.allowed
        with pytest.raises(ValueError, match="timeout=0"):
            c.refund(r.reservation_id, timeout=0)
        c.refund(r.reservation_id, timeout=5)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="timeout"):
            BudgetClient(service.target, timeout=bad)
        with pytest.raises(ValueError, match="timeout"):
            AsyncBudgetClient(service.target, timeout=bad)


def test_the_sync_client_reserves_and_settles_in_two_halves(service):
    with BudgetClient(service.target, token=TOKEN) as c:
        r = c.reserve(**ask("u11", lease_ttl_ms=1500))
        keep = c.keep_alive(r)
        time.sleep(2.5)
        c.stop_keep_alive(keep)
        r.set_usage(100, 20)
        c.settle(r)
        assert r.settled.outcome == pb.OUTCOME_APPLIED, "renewed past its 1.5 s lease, then committed"
        assert user_tokens_left(c, "u11") == 5000 - 120
        r2 = c.reserve(**ask("u11"))
        c.settle(r2, failed=True)
        assert isinstance(r2.settled, pb.RefundResponse) and r2.settled.outcome == pb.OUTCOME_APPLIED
        held = [c.reserve(**ask("u11")) for _ in range(2)]
        with pytest.raises(BudgetDenied):
            c.reserve(**ask("u11"))
        for h in held:
            c.settle(h)
        assert all(isinstance(h.settled, pb.RefundResponse) for h in held), "no usage, no output: refunded"


def count(c: BudgetClient, text: str) -> int:
    """The service's count of ``text`` (as it counts a completion_text)."""
    probe = c.check_and_reserve(tenant="probe", tier="t", model="gpt-4o", prompt=text, max_output_tokens=1)
    c.refund(probe.reservation_id)
    return probe.estimated_prompt_tokens


def test_output_that_reached_the_caller_is_committed_not_refunded(service):
    """A stream cut short, or one whose upstream sent no usage: the prompt
    as reserved and the completion counted from the text delivered. Only a
    call that delivered nothing is refunded."""
    delivered = ["Once upon", " a time, there", " was a budget."]
    with BudgetClient(service.target, token=TOKEN) as c:
        # No usage chunk: the block ends cleanly with only the text.
        with c.reservation(tenant="acme", user="u12", tier="t", model="gpt-4o",
                           messages=[{"role": "user", "content": "Tell me a story."}], max_output_tokens=50) as r:
            for piece in delivered:
                r.record_output(piece)
        commit = r.settled
        assert isinstance(commit, pb.CommitResponse) and commit.outcome == pb.OUTCOME_APPLIED
        assert commit.completion_tokens == count(c, "".join(delivered)) > 0
        assert commit.token_delta == commit.completion_tokens - 50, "the prompt charged as reserved"
        assert user_tokens_left(c, "u12") == 5000 - r.reserved_prompt_tokens - commit.completion_tokens
        # Broken after the first chunk reached the caller: committed too.
        with pytest.raises(ConnectionError):
            with c.reservation(**ask("u12")) as r2:
                r2.record_output(delivered[0])
                raise ConnectionError("upstream reset the stream")
        assert isinstance(r2.settled, pb.CommitResponse)
        assert r2.settled.completion_tokens == count(c, delivered[0])
        assert r2.reserved_prompt_tokens == 100, "the caller's own prompt count"
        # Broken before anything reached the caller: refunded.
        with pytest.raises(ConnectionError):
            with c.reservation(**ask("u12")) as r3:
                raise ConnectionError("upstream refused")
        assert isinstance(r3.settled, pb.RefundResponse)

    async def run():
        async with AsyncBudgetClient(service.target, token=TOKEN) as a:
            r = await a.reserve(**ask("u12"))
            r.record_output("")  # a chunk with no text (the role) reached the caller
            await a.settle(r, failed=True)
            assert isinstance(r.settled, pb.CommitResponse) and r.settled.completion_tokens == 0

    asyncio.run(run())
