"""Decisions to HTTP, as docs/http.md defines them.

``http_status_and_headers(response)`` answers the status a gateway returns
and the headers it sends: 200 (forward), 429 / 413 / 403, ``Retry-After`` on
a 429, and OpenAI's ``x-ratelimit-limit|remaining|reset-requests|tokens``.

The headers describe the caller's own scope: only the session's, the user's
and the tenant's limits feed them, never the global level (the size of the
provider account is not the gateway's customer's to see). Which of those
entries: when denied at the session, user or tenant level, the entry of the
binding limit (``limiting_level``, ``limiting_model_group``,
``limiting_dimension``, ``limiting_period_seconds``); otherwise, among the
session, user and tenant entries of the dimension (the all-model ones and
those of the request's model group), the one with the least
``remaining / limit`` (the innermost level on a tie: the session's, else the
user's) — the service's own rule (``crates/server/src/api/http.rs``, ``binding_in``). A
dimension without such an entry gets no headers. A denial at the global
level is a 429 with ``Retry-After`` only (a 413 with no headers when the
request can never fit).
Negative ``remaining`` (debt) shows as 0; the reset is OpenAI's duration
format (``20ms``, ``6s``, ``1m30s``).

A blocked tenant or user (``REASON_BLOCKED``) is a 403 without
``Retry-After``: retrying cannot help until an operator unblocks it.
"""

from __future__ import annotations

import math

from .v1 import budget_pb2 as pb

_HEADER_DIMENSIONS = (("requests", pb.DIMENSION_REQUESTS), ("tokens", pb.DIMENSION_TOKENS))
#: The levels whose limits the headers may show: the caller's own.
_CALLER_LEVELS = (pb.LEVEL_TENANT, pb.LEVEL_USER, pb.LEVEL_SESSION)


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


def _share_left(entry: pb.LimitStatus) -> float:
    return max(entry.remaining, 0) / entry.limit if entry.limit else math.inf


def _binding(response: pb.CheckAndReserveResponse, dimension: pb.Dimension) -> pb.LimitStatus | None:
    """The session, user or tenant entry of ``dimension`` that feeds the
    headers."""
    entries = [e for e in response.limits if e.dimension == dimension and e.level in _CALLER_LEVELS]
    if not response.allowed and response.limiting_dimension == dimension:
        for e in entries:
            if (
                e.level == response.limiting_level
                and e.model_group == response.limiting_model_group
                and e.period_seconds == response.limiting_period_seconds
            ):
                return e
    if not entries:
        return None
    # Least share left; on a tie the innermost level (session, then user),
    # then the entry listed last, as the service picks.
    return min(reversed(entries), key=lambda e: (_share_left(e), -e.level))


def _headers(response: pb.CheckAndReserveResponse) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, dimension in _HEADER_DIMENSIONS:
        e = _binding(response, dimension)
        if e is None:
            continue
        headers[f"x-ratelimit-limit-{name}"] = str(e.limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(max(e.remaining, 0))
        headers[f"x-ratelimit-reset-{name}"] = duration(e.reset_after_ms)
    return headers


def http_status_and_headers(response: pb.CheckAndReserveResponse) -> tuple[int, dict[str, str]]:
    """The HTTP status and headers for a ``CheckAndReserveResponse``."""
    if response.allowed:
        return 200, _headers(response)
    if response.reason == pb.REASON_BLOCKED:
        # An operator's block: no limit to report, and no retry can pass.
        return 403, {}
    if response.reason == pb.REASON_CONTEXT_TOO_LARGE:
        # The request must shrink: no limit to report.
        return 413, {}
    if response.limiting_level == pb.LEVEL_GLOBAL:
        # The provider account's limit: when to retry, never its size.
        if response.reason == pb.REASON_REQUEST_TOO_LARGE:
            return 413, {}
        return 429, {"Retry-After": _retry_after(response)}
    headers = _headers(response)
    if response.reason == pb.REASON_REQUEST_TOO_LARGE:
        # It can never fit: no Retry-After (a client retrying 429s would loop).
        return 413, headers
    headers["Retry-After"] = _retry_after(response)
    return 429, headers


def _retry_after(response: pb.CheckAndReserveResponse) -> str:
    return str(math.ceil(response.retry_after_ms / 1000))
