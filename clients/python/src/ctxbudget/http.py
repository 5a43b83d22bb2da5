"""Decisions to HTTP, as docs/http.md defines them.

``http_status_and_headers(response)`` answers the status a gateway returns
and the headers it sends: 200 (forward) or 429 / 413, ``Retry-After`` on a
429, and OpenAI's ``x-ratelimit-limit|remaining|reset-requests|tokens``.

Which limit feeds the headers when several apply: when denied, the entry of
the binding limit (``limiting_level``, ``limiting_model_group``,
``limiting_dimension``, and ``limiting_period_seconds``); when allowed,
among the entries of the dimension (the all-model ones and those of the
request's model group), the one with the least ``remaining / limit``.
Negative ``remaining`` (debt) shows as 0; the reset is OpenAI's duration
format (``20ms``, ``6s``, ``1m30s``).
"""

from __future__ import annotations

import math

from .v1 import budget_pb2 as pb

_HEADER_DIMENSIONS = (("requests", pb.DIMENSION_REQUESTS), ("tokens", pb.DIMENSION_TOKENS))


def duration(ms: int) -> str:
    """OpenAI's reset format (Go's duration): ``0s``, ``20ms``, ``6s``,
    ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    out = ""
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + f"{seconds}s"


def _binding(response: pb.CheckAndReserveResponse, dimension: int) -> pb.LimitStatus | None:
    """The entry of ``dimension`` that feeds the headers."""
    entries = [l for l in response.limits if l.dimension == dimension]
    if not response.allowed and response.limiting_dimension == dimension:
        for l in entries:
            if (
                l.level == response.limiting_level
                and l.model_group == response.limiting_model_group
                and l.period_seconds == response.limiting_period_seconds
            ):
                return l
    if not entries:
        return None
    # Least share left; ties to the outer level (the order the service lists them).
    return min(entries, key=lambda l: (max(l.remaining, 0) / l.limit) if l.limit else math.inf)


def http_status_and_headers(response: pb.CheckAndReserveResponse) -> tuple[int, dict[str, str]]:
    """The HTTP status and headers for a ``CheckAndReserveResponse``."""
    headers: dict[str, str] = {}
    for name, dimension in _HEADER_DIMENSIONS:
        l = _binding(response, dimension)
        if l is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(l.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(max(l.remaining, 0))
        headers[f"x-ratelimit-reset-{name}"] = duration(l.reset_after_ms)
    if response.allowed:
        return 200, headers
    if response.reason == pb.REASON_CONTEXT_TOO_LARGE:
        # The request must shrink: no limit to report.
        return 413, {}
    if response.reason == pb.REASON_REQUEST_TOO_LARGE:
        # It can never fit: no Retry-After (a client retrying 429s would loop).
        return 413, headers
    headers["Retry-After"] = str(math.ceil(response.retry_after_ms / 1000))
    return 429, headers
