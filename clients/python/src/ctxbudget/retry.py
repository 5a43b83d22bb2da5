"""Retrying a gateway's upstream call: ``retry`` (blocking) and ``retry_async``.

Retried: HTTP 408, 425, 429, 500, 502, 503, 504, 529 and connection errors
(the call never got an answer). Never retried: anything else, 400, 401, 403,
404 and 422 included. Waits are exponential with full jitter —
``uniform(0, min(max_delay, base_delay × 2^attempt))`` — but never shorter
than the answer's ``Retry-After`` (seconds or an HTTP date) or
``retry-after-ms``; an answer asking to wait longer than ``max_retry_after``
is returned as it is. Every attempt gets the same idempotency key, so an
upstream that saw an earlier attempt can tell.

``call(idempotency_key)`` makes one attempt and returns the response (any
object with ``status_code`` or ``status`` and ``headers``), or raises; an
exception carrying a retryable ``status_code`` (like the ``openai`` SDK's
``APIStatusError``) is retried too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import email.utils
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
NEVER_RETRIED = frozenset({400, 401, 403, 404, 422})

T = TypeVar("T")


def _connection_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, asyncio.TimeoutError]
    try:
        import httpx

        errors.append(httpx.TransportError)
    except ImportError:
        pass
    try:
        import openai

        errors.extend([openai.APIConnectionError])
    except ImportError:
        pass
    return tuple(errors)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How many attempts and how long between them (seconds)."""

    max_attempts: int = 4
    base_delay: float = 0.25
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """The wait after failed attempt ``attempt`` (0-based)."""
        jitter = random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt))
        return max(jitter, retry_after or 0.0)


def status_of(obj: Any) -> int | None:
    status = getattr(obj, "status_code", None)
    if status is None:
        status = getattr(obj, "status", None)
    if status is None and getattr(obj, "response", None) is not None:
        # httpx.HTTPStatusError carries its status on its response.
        status = getattr(obj.response, "status_code", None)
    return status if isinstance(status, int) else None


def retry_after_of(obj: Any) -> float | None:
    """Seconds the answer asks to wait (``retry-after-ms``, ``Retry-After``)."""
    headers = getattr(obj, "headers", None)
    if headers is None and getattr(obj, "response", None) is not None:
        headers = getattr(obj.response, "headers", None)
    if not headers:
        return None
    lower = {str(k).lower(): str(v) for k, v in dict(headers).items()}
    if "retry-after-ms" in lower:
        try:
            return float(lower["retry-after-ms"]) / 1000
        except ValueError:
            pass
    value = lower.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: the backoff alone decides
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def _decide(policy: RetryPolicy, attempt: int, outcome: Any) -> float | None:
    """The wait before another attempt, or None to stop with ``outcome``."""
    if attempt + 1 >= policy.max_attempts:
        return None
    status = status_of(outcome)
    if isinstance(outcome, BaseException):
        if status is None and not isinstance(outcome, _connection_errors()):
            return None
    elif status is None:
        return None  # a result without a status (an SDK's parsed reply): done
    if status is not None and status not in RETRY_STATUSES:
        return None
    after = retry_after_of(outcome)
    if after is not None and after > policy.max_retry_after:
        return None
    return policy.delay(attempt, after)


def retry(
    call: Callable[[str], T],
    *,
    policy: RetryPolicy = RetryPolicy(),
    idempotency_key: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Calls ``call(key)`` until it succeeds, fails for good, or the attempts
    run out; returns the last response or raises the last error."""
    key = idempotency_key or uuid.uuid4().hex
    attempt = 0
    while True:
        outcome: T | Exception
        try:
            outcome = call(key)
        except Exception as e:  # noqa: BLE001 - classified below
            outcome = e
        wait = _decide(policy, attempt, outcome)
        if wait is None:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        sleep(wait)
        attempt += 1


async def retry_async(
    call: Callable[[str], Awaitable[T]],
    *,
    policy: RetryPolicy = RetryPolicy(),
    idempotency_key: str | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``retry`` for a coroutine ``call``."""
    key = idempotency_key or uuid.uuid4().hex
    attempt = 0
    while True:
        outcome: T | Exception
        try:
            outcome = await call(key)
        except Exception as e:  # noqa: BLE001 - classified below
            outcome = e
        wait = _decide(policy, attempt, outcome)
        if wait is None:
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        await sleep(wait)
        attempt += 1
