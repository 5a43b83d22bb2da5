"""``http_status_and_headers``: the documented mapping (docs/http.md), on
responses built by hand."""

from ctxbudget import duration, http_status_and_headers, pb


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
