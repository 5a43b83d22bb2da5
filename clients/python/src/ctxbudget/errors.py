"""What the client raises. Every error is a ``BudgetError`` carrying the gRPC
status name (``.code``) and the service's message (``.details``), and the
HTTP status a gateway answers its own caller with (``.http_status``):

======================  =========================================  ====
``.code``               raised as                                  HTTP
======================  =========================================  ====
``INVALID_ARGUMENT``    ``BudgetInvalidArgument``                  400
``FAILED_PRECONDITION`` ``BudgetError``                            400
``OUT_OF_RANGE``        ``BudgetError`` (a prompt over the
                        service's ``max_message_bytes``)           413
``NOT_FOUND``           ``BudgetNotFound``                         500
``PERMISSION_DENIED``,  ``BudgetPermissionDenied`` (the gateway's  500
``UNAUTHENTICATED``     own token or tenant binding)
``UNAVAILABLE``,        ``BudgetUnavailable``                      503
``DEADLINE_EXCEEDED``
anything else           ``BudgetError``                            500
======================  =========================================  ====

The caller's mistakes (a malformed id, an unknown tier, a spent idempotency
key) are 4xx; ctxbudget not answering is 503 with ``Retry-After``, or a call
let through under ``on_unavailable="allow"``; the gateway's own set-up (its
token, a reservation it lost, the service's internal errors) is 500, since the
gateway's caller can do nothing about it.

A denial is ``BudgetDenied``: an answer, not a failed call (``.code`` is
``"OK"``); its ``http_status`` is 429, 413 or 403 (docs/http.md).
"""

from __future__ import annotations

import grpc

from .v1 import budget_pb2 as pb

#: The HTTP status for each gRPC status name (the table above); 500 otherwise.
HTTP_STATUS_OF_CODE = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 413,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 503,
}


class BudgetError(Exception):
    """Base of the errors this package raises, and itself the error of a gRPC
    status without a class of its own.

    Attributes:
        code: the gRPC status name, e.g. ``"INVALID_ARGUMENT"`` (``"OK"`` for
            a denial).
        details: the service's message (what to fix).
        http_status: what a gateway answers its own caller.
        headers: HTTP headers to send with that answer.
    """

    def __init__(self, message: str, *, code: str = "UNKNOWN", details: str = ""):
        super().__init__(message)
        self.code = code
        self.details = details
        self.http_status: int = HTTP_STATUS_OF_CODE.get(code, 500)
        self.headers: dict[str, str] = {}


class BudgetInvalidArgument(BudgetError):
    """``INVALID_ARGUMENT``: the request is malformed (an id that is not 1–256
    bytes of UTF-8, an unknown tier, …); ``details`` names the field. Nothing
    was changed. HTTP 400."""


class BudgetNotFound(BudgetError):
    """``NOT_FOUND``: the reservation is unknown or long gone (nothing to
    settle)."""


class BudgetPermissionDenied(BudgetError):
    """``PERMISSION_DENIED`` (the token may not act for this tenant) or
    ``UNAUTHENTICATED`` (no token, or an unknown one): ``.code`` says which."""


class BudgetUnavailable(BudgetError):
    """ctxbudget could not be reached or did not answer in time
    (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``). From ``reservation()`` and
    ``reserve()`` only when ``on_unavailable`` is ``"deny"``: answer 503, or
    retry later."""

    def __init__(self, message: str, *, code: str = "UNAVAILABLE", details: str = ""):
        super().__init__(message, code=code, details=details)
        self.headers = {"Retry-After": "1"}


def level_name(level: int) -> str:
    """A ``Level``'s lower-case name (``LEVEL_SESSION``: ``"session"``), as
    the service names levels in its messages; "" for ``LEVEL_UNSPECIFIED``
    or a level this client does not know."""
    try:
        name = pb.Level.Name(level)
    except ValueError:
        return ""
    return "" if level == pb.LEVEL_UNSPECIFIED else name.removeprefix("LEVEL_").lower()


class BudgetDenied(BudgetError):
    """CheckAndReserve said no.

    Attributes:
        reason: the ``Reason`` name, e.g. ``"REASON_RPM_EXCEEDED"``.
        level: the ``Level`` name that denied, e.g. ``"LEVEL_USER"``,
            ``"LEVEL_SESSION"`` (one session of the user: an agent run).
        level_name: the same in the service's words, as its messages and
            error bodies say it: ``"global"``, ``"tenant"``, ``"user"``,
            ``"session"`` ("" when no level denied, e.g. a request over
            the tier's context).
        retry_after_ms: when a retry may pass (0: never as sent).
        http_status: 429; 413 for a request that can never fit; 403 for a
            blocked tenant or user.
        headers: ``Retry-After`` and ``x-ratelimit-*`` to send back.
        response: the full ``CheckAndReserveResponse``.
    """

    def __init__(self, response: pb.CheckAndReserveResponse, http_status: int, headers: dict[str, str]):
        self.response = response
        self.reason = pb.Reason.Name(response.reason)
        self.level = pb.Level.Name(response.limiting_level)
        self.level_name = level_name(response.limiting_level)
        self.retry_after_ms = response.retry_after_ms
        super().__init__(f"{self.reason} at {self.level}: {response.detail}", code="OK", details=response.detail)
        self.http_status = http_status
        self.headers = headers


_CLASS_OF_CODE: dict[grpc.StatusCode, type[BudgetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: BudgetInvalidArgument,
    grpc.StatusCode.NOT_FOUND: BudgetNotFound,
    grpc.StatusCode.PERMISSION_DENIED: BudgetPermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: BudgetPermissionDenied,
    grpc.StatusCode.UNAVAILABLE: BudgetUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: BudgetUnavailable,
}


def error_of(error: grpc.RpcError) -> BudgetError:
    """The ``BudgetError`` for a failed gRPC call (raise it ``from`` the
    original)."""
    # grpc.RpcError itself promises no code(): the errors grpc raises (a
    # grpc.Call, grpc.aio.AioRpcError) have one.
    code = error.code() if callable(getattr(error, "code", None)) else None
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(error)
    cls = _CLASS_OF_CODE.get(code, BudgetError) if code is not None else BudgetError
    prefix = "ctxbudget unavailable" if cls is BudgetUnavailable else "ctxbudget"
    return cls(f"{prefix}: {name}: {details}", code=name, details=details)
