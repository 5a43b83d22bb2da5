"""ctxbudget's Python client: request, token and concurrency budgets for LLM
gateways.

    from ctxbudget import AsyncBudgetClient, BudgetDenied

    client = AsyncBudgetClient("127.0.0.1:50051")
    try:
        async with client.reservation(tenant="acme", user="alice", tier="pro", model="gpt-4o",
                                      messages=messages, max_output_tokens=1024) as r:
            reply = await upstream(messages, max_tokens=r.granted_max_output_tokens)
            r.set_usage(reply.usage.prompt_tokens, reply.usage.completion_tokens)
    except BudgetDenied as d:
        return Response(status_code=d.http_status, headers=d.headers)
"""

from ._common import ReservationState, Tls, Usage, reserve_request
from .aio import AsyncBudgetClient
from .client import BudgetClient
from .errors import BudgetDenied, BudgetError, BudgetUnavailable
from .http import duration, http_status_and_headers
from .retry import RETRY_STATUSES, RetryPolicy, retry, retry_async
from .v1 import budget_pb2 as pb

__all__ = [
    "AsyncBudgetClient",
    "BudgetClient",
    "BudgetDenied",
    "BudgetError",
    "BudgetUnavailable",
    "RETRY_STATUSES",
    "ReservationState",
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
