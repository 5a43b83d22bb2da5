"""ctxbudget's Python client: request, token and concurrency budgets for LLM
gateways.

    from ctxbudget import AsyncBudgetClient, BudgetError

    client = AsyncBudgetClient("127.0.0.1:50051")
    try:
        async with client.reservation(tenant="acme", user="alice", tier="pro", model="gpt-4o",
                                      messages=messages, max_output_tokens=1024) as r:
            reply = await upstream(messages, max_tokens=r.granted_max_output_tokens)
            r.set_usage(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    except BudgetError as e:   # BudgetDenied (429/413/403), BudgetUnavailable (503), ...
        return Response(status_code=e.http_status, headers=e.headers)
"""

from ._common import LimitStatusesName, PriorityName, ReservationState, ReserveFields, Tls, Usage, reserve_request
from .aio import AsyncBudgetClient
from .client import BudgetClient, KeepAlive
from .errors import (
    BudgetDenied,
    BudgetError,
    BudgetInvalidArgument,
    BudgetNotFound,
    BudgetPermissionDenied,
    BudgetUnavailable,
)
from .http import duration, http_status_and_headers
from .retry import RETRY_STATUSES, RetryPolicy, retry, retry_async
from .v1 import budget_pb2 as pb

__all__ = [
    "RETRY_STATUSES",
    "AsyncBudgetClient",
    "BudgetClient",
    "BudgetDenied",
    "BudgetError",
    "BudgetInvalidArgument",
    "BudgetNotFound",
    "BudgetPermissionDenied",
    "BudgetUnavailable",
    "KeepAlive",
    "LimitStatusesName",
    "PriorityName",
    "ReservationState",
    "ReserveFields",
    "RetryPolicy",
    "Tls",
    "Usage",
    "duration",
    "http_status_and_headers",
    "pb",
    "reserve_request",
    "retry",
    "retry_async",
]
