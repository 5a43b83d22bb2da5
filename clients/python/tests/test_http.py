"""``http_status_and_headers``: the documented mapping (docs/http.md), on
responses built by hand and from a real service; and the HTTP status of each
gRPC error."""

import grpc
import pytest

from conftest import Service
from ctxbudget import BudgetClient, BudgetDenied, duration, http_status_and_headers, pb
from ctxbudget.errors import BudgetError, BudgetInvalidArgument, BudgetNotFound, BudgetPermissionDenied, BudgetUnavailable, error_of


def limit(level, dimension, limit, remaining, reset_ms, period=60, group=""):
    return pb.LimitStatus(level=level, dimension=dimension, limit=limit, remaining=remaining,
                          reset_after_ms=reset_ms, period_seconds=period, model_group=group)


def test_allowed_headers_come_from_the_least_share_left():
    r = pb.CheckAndReserveResponse(allowed=True, limits=[
        limit(pb.LEVEL_TENANT, pb.DIMENSION_REQUESTS, 100, 90, 6000),
        limit(pb.LEVEL_USER, pb.DIMENSION_REQUESTS, 10, 2, 54000),
        limit(pb.LEVEL_USER, pb.DIMENSION_TOKENS, 50000, -300, 90500),
    ])
    status, h = http_status_and_headers(r)
    assert status == 200
    assert h["x-ratelimit-limit-requests"] == "10" and h["x-ratelimit-remaining-requests"] == "2"
    assert h["x-ratelimit-reset-requests"] == "54s"
    assert h["x-ratelimit-remaining-tokens"] == "0", "debt shows as 0"
    assert h["x-ratelimit-reset-tokens"] == "1m30.5s"
    assert "Retry-After" not in h


def test_a_denial_reports_the_binding_limit_and_retry_after():
    r = pb.CheckAndReserveResponse(
        allowed=False, reason=pb.REASON_TPM_EXCEEDED, limiting_level=pb.LEVEL_TENANT,
        limiting_dimension=pb.DIMENSION_TOKENS, limiting_period_seconds=86400, retry_after_ms=2100,
        limiting_model_group="gpt-4o",
        limits=[
            limit(pb.LEVEL_USER, pb.DIMENSION_TOKENS, 1000, 0, 100),
            limit(pb.LEVEL_TENANT, pb.DIMENSION_TOKENS, 9000, 5, 7000, period=86400, group="gpt-4o"),
            limit(pb.LEVEL_TENANT, pb.DIMENSION_TOKENS, 5000, 4000, 100, period=86400),
        ])
    status, h = http_status_and_headers(r)
    assert status == 429
    assert h["Retry-After"] == "3"
    assert h["x-ratelimit-limit-tokens"] == "9000", "the group's tenant limit bound"


def test_too_large_is_413_without_retry_after():
    ctx = pb.CheckAndReserveResponse(allowed=False, reason=pb.REASON_CONTEXT_TOO_LARGE)
    assert http_status_and_headers(ctx) == (413, {})
    big = pb.CheckAndReserveResponse(
        allowed=False, reason=pb.REASON_REQUEST_TOO_LARGE, limiting_level=pb.LEVEL_USER,
        limiting_dimension=pb.DIMENSION_TOKENS,
        limits=[limit(pb.LEVEL_USER, pb.DIMENSION_TOKENS, 1000, 1000, 0)])
    status, h = http_status_and_headers(big)
    assert status == 413 and "Retry-After" not in h and h["x-ratelimit-limit-tokens"] == "1000"


def test_durations_read_like_openais():
    assert [duration(ms) for ms in (0, 20, 1000, 1500, 360000, 3723000)] == ["0s", "20ms", "1s", "1.5s", "6m0s", "1h2m3s"]


def test_headers_never_show_the_global_level():
    """The global level is the provider account: its size is not the
    caller's to see, even when its share left is the smallest."""
    r = pb.CheckAndReserveResponse(allowed=True, limits=[
        limit(pb.LEVEL_GLOBAL, pb.DIMENSION_TOKENS, 100_000_000, 10, 0),
        limit(pb.LEVEL_TENANT, pb.DIMENSION_TOKENS, 5_000_000, 4_000_000, 7000, period=86400),
        limit(pb.LEVEL_USER, pb.DIMENSION_TOKENS, 50_000, 45_000, 900),
        limit(pb.LEVEL_GLOBAL, pb.DIMENSION_REQUESTS, 10_000, 9_000, 100),
    ])
    status, h = http_status_and_headers(r)
    assert status == 200
    assert h["x-ratelimit-limit-tokens"] == "5000000" and h["x-ratelimit-remaining-tokens"] == "4000000", h
    assert "x-ratelimit-limit-requests" not in h, "requests are limited only at the global level: no headers"


def test_a_tie_goes_to_the_users_limit():
    r = pb.CheckAndReserveResponse(allowed=True, limits=[
        limit(pb.LEVEL_TENANT, pb.DIMENSION_REQUESTS, 100, 50, 6000),
        limit(pb.LEVEL_USER, pb.DIMENSION_REQUESTS, 10, 5, 3000),
    ])
    assert http_status_and_headers(r)[1]["x-ratelimit-limit-requests"] == "10"


def test_a_denial_at_the_global_level_is_a_429_with_retry_after_only():
    r = pb.CheckAndReserveResponse(
        allowed=False, reason=pb.REASON_TPM_EXCEEDED, limiting_level=pb.LEVEL_GLOBAL,
        limiting_dimension=pb.DIMENSION_TOKENS, limiting_period_seconds=60, retry_after_ms=1500,
        limits=[
            limit(pb.LEVEL_GLOBAL, pb.DIMENSION_TOKENS, 100_000_000, -5, 1500),
            limit(pb.LEVEL_TENANT, pb.DIMENSION_TOKENS, 5000, 4000, 100),
            limit(pb.LEVEL_USER, pb.DIMENSION_REQUESTS, 10, 9, 100),
        ])
    assert http_status_and_headers(r) == (429, {"Retry-After": "2"})
    never = pb.CheckAndReserveResponse(
        allowed=False, reason=pb.REASON_REQUEST_TOO_LARGE, limiting_level=pb.LEVEL_GLOBAL,
        limiting_dimension=pb.DIMENSION_TOKENS,
        limits=[limit(pb.LEVEL_GLOBAL, pb.DIMENSION_TOKENS, 1000, 1000, 0)])
    assert http_status_and_headers(never) == (413, {})


def test_a_blocked_tenant_is_a_403_without_retry_after():
    r = pb.CheckAndReserveResponse(
        allowed=False, reason=pb.REASON_BLOCKED, limiting_level=pb.LEVEL_TENANT,
        detail="blocked by an operator: unpaid invoice",
        limits=[limit(pb.LEVEL_TENANT, pb.DIMENSION_REQUESTS, 100, 90, 6000)])
    assert http_status_and_headers(r) == (403, {})
    d = BudgetDenied(r, *http_status_and_headers(r))
    assert d.http_status == 403 and d.reason == "REASON_BLOCKED" and "Retry-After" not in d.headers
    assert d.details == "blocked by an operator: unpaid invoice"


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code, cls, status", [
    (grpc.StatusCode.INVALID_ARGUMENT, BudgetInvalidArgument, 400),
    (grpc.StatusCode.FAILED_PRECONDITION, BudgetError, 400),
    (grpc.StatusCode.OUT_OF_RANGE, BudgetError, 413),
    (grpc.StatusCode.NOT_FOUND, BudgetNotFound, 500),
    (grpc.StatusCode.PERMISSION_DENIED, BudgetPermissionDenied, 500),
    (grpc.StatusCode.UNAUTHENTICATED, BudgetPermissionDenied, 500),
    (grpc.StatusCode.UNAVAILABLE, BudgetUnavailable, 503),
    (grpc.StatusCode.DEADLINE_EXCEEDED, BudgetUnavailable, 503),
    (grpc.StatusCode.INTERNAL, BudgetError, 500),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, BudgetError, 500),
])
def test_every_grpc_code_has_its_error_class_and_http_status(code, cls, status):
    e = error_of(FakeRpcError(code, "what to fix"))
    assert type(e) is cls and e.code == code.name and e.details == "what to fix"
    assert e.http_status == status
    assert ("Retry-After" in e.headers) == (status == 503)


GLOBAL = """
[reservations]
retry_jitter_ms = 0

[global]
requests = [{ limit = 2, period = "1h" }]
tokens = [{ limit = 100000000, period = "1m" }]

[tiers.free]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 5000000, window = "day" }] }
user = { tokens = [{ limit = 50000, period = "1d" }] }
"""


def test_a_real_service_never_shows_the_global_level():
    """Against the service: requests are limited only globally (no
    request headers at all), tokens at every level (the user's or tenant's
    headers, never the 100,000,000 of the account); the third request is
    denied by the global limit: a 429 with Retry-After alone."""
    service = Service(GLOBAL)
    try:
        with BudgetClient(service.target) as c:
            ask = dict(tenant="acme", user="alice", tier="free", prompt_tokens=100, max_output_tokens=10)
            for _ in range(2):
                with c.reservation(**ask) as r:
                    h = r.headers
                    assert h["x-ratelimit-limit-tokens"] in ("50000", "5000000"), h
                    assert "x-ratelimit-limit-requests" not in h, h
                    r.set_usage(100, 10)
            with pytest.raises(BudgetDenied) as e:
                c.reservation(**ask).__enter__()
            assert e.value.level == "LEVEL_GLOBAL"
            assert e.value.http_status == 429 and list(e.value.headers) == ["Retry-After"], e.value.headers
    finally:
        service.stop()
