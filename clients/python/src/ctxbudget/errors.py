"""What the client raises: a denial (with everything a gateway needs to answer
its own caller) and an unreachable ctxbudget."""

from __future__ import annotations

from .v1 import budget_pb2 as pb


class BudgetError(Exception):
    """Base of the errors this package raises."""


class BudgetDenied(BudgetError):
    """CheckAndReserve said no.

    Attributes:
        reason: the ``Reason`` name, e.g. ``"REASON_RPM_EXCEEDED"``.
        level: the ``Level`` name that denied, e.g. ``"LEVEL_USER"``.
        retry_after_ms: when a retry may pass (0: never as sent, for 413).
        http_status: 429, or 413 for a request that can never fit.
        headers: ``Retry-After`` and ``x-ratelimit-*`` to send back.
        response: the full ``CheckAndReserveResponse``.
    """

    def __init__(self, response: pb.CheckAndReserveResponse, http_status: int, headers: dict[str, str]):
        self.response = response
        self.reason = pb.Reason.Name(response.reason)
        self.level = pb.Level.Name(response.limiting_level)
        self.retry_after_ms = response.retry_after_ms
        self.http_status = http_status
        self.headers = headers
        super().__init__(f"{self.reason} at {self.level}: {response.detail}")


class BudgetUnavailable(BudgetError):
    """ctxbudget could not be reached (or did not answer in time) and the
    client's ``on_unavailable`` is ``"deny"``: answer 503, or retry later."""

    http_status = 503

    def __init__(self, detail: str):
        super().__init__(f"ctxbudget unavailable: {detail}")
        self.headers = {"Retry-After": "1"}
