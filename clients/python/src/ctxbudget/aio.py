"""``AsyncBudgetClient``: every RPC of ctxbudget on an asyncio gRPC channel,
``reserve()`` / ``settle()``, and ``reservation()`` as an ``async with``
block."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeVar

import grpc
import grpc.aio

from ._common import (
    AsyncStub,
    CommitParts,
    OnUnavailable,
    ReservationState,
    ReserveFields,
    Tls,
    check_on_unavailable,
    check_timeout,
    commit_message,
    denied,
    metadata,
    request_of,
    status_request,
    traced,
    waiting_timeout,
)
from .errors import BudgetError, BudgetUnavailable, error_of
from .v1 import budget_pb2 as pb
from .v1 import budget_pb2_grpc as rpc

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Self, Unpack
    else:
        from typing_extensions import Self, Unpack

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class AsyncBudgetClient:
    """The asyncio twin of ``BudgetClient`` (same arguments, same methods,
    awaited)."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        timeout: float = 2.0,
        tls: Tls | None = None,
        on_unavailable: OnUnavailable = "deny",
        channel: grpc.aio.Channel | None = None,
    ):
        self.on_unavailable: OnUnavailable = check_on_unavailable(on_unavailable)
        self.timeout: float = check_timeout(timeout) or 2.0
        self._target, self._tls = target, tls
        # Made on first use, in the event loop that uses it (an asyncio
        # channel belongs to the loop it was made in: a client built at
        # import time would otherwise fail in the server's loop).
        self._channel: grpc.aio.Channel | None = channel
        self._stub_: AsyncStub | None = rpc.BudgetServiceStub(channel) if channel else None
        self._metadata = metadata(token)

    @property
    def _stub(self) -> AsyncStub:
        if self._stub_ is None:
            if self._tls is None:
                self._channel = grpc.aio.insecure_channel(self._target)
            else:
                self._channel = grpc.aio.secure_channel(self._target, self._tls.credentials(), options=self._tls.options())
            self._stub_ = rpc.BudgetServiceStub(self._channel)
        return self._stub_

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel, self._stub_ = None, None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: grpc.aio.UnaryUnaryMultiCallable[Req, Resp], request: Req, timeout: float | None) -> Resp:
        deadline = self.timeout if check_timeout(timeout) is None else timeout
        try:
            return await method(request, timeout=deadline, metadata=traced(self._metadata))
        except grpc.RpcError as e:
            raise error_of(e) from e

    async def check_and_reserve(
        self,
        request: pb.CheckAndReserveRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[ReserveFields],
    ) -> pb.CheckAndReserveResponse:
        """See ``BudgetClient.check_and_reserve``."""
        req = request_of(request, fields)
        return await self._call(self._stub.CheckAndReserve, req, waiting_timeout(req, timeout, self.timeout))

    async def commit(
        self,
        reservation_id: str,
        prompt_tokens: int,
        completion_tokens: int = 0,
        cached_prompt_tokens: int = 0,
        *,
        completion_text: str = "",
        timeout: float | None = None,
        **parts: Unpack[CommitParts],
    ) -> pb.CommitResponse:
        """See ``BudgetClient.commit``."""
        req = commit_message(reservation_id, prompt_tokens, completion_tokens, cached_prompt_tokens, completion_text, parts)
        return await self._call(self._stub.Commit, req, timeout)

    async def refund(self, reservation_id: str, *, timeout: float | None = None) -> pb.RefundResponse:
        """Return a reservation's request and tokens and free its slot
        (idempotent)."""
        return await self._call(self._stub.Refund, pb.RefundRequest(reservation_id=reservation_id), timeout)

    async def renew_lease(self, reservation_id: str, lease_ttl_ms: int | None = None, *, timeout: float | None = None) -> pb.RenewLeaseResponse:
        """Extend a live reservation's concurrency lease (``lease_ttl_ms``
        from now; None: the service's default)."""
        req = pb.RenewLeaseRequest(reservation_id=reservation_id)
        if lease_ttl_ms is not None:
            req.lease_ttl_ms = lease_ttl_ms
        return await self._call(self._stub.RenewLease, req, timeout)

    async def get_status(
        self, tenant: str, tier: str, user: str = "", model: str = "", *, session: str = "", timeout: float | None = None
    ) -> pb.GetStatusResponse:
        """Read the budgets of a tenant (and user, and session, and model
        group) without reserving anything. ``session``: also the
        ``LEVEL_SESSION`` entries of that session of ``user``."""
        return await self._call(self._stub.GetStatus, status_request(tenant, tier, user, model, session), timeout)

    async def get_estimator(self, model: str = "", *, timeout: float | None = None) -> pb.GetEstimatorResponse:
        """The adaptive token estimator's multipliers and samples (one
        model's key, or every key)."""
        return await self._call(self._stub.GetEstimator, pb.GetEstimatorRequest(model=model), timeout)

    async def reserve(self, *, timeout: float | None = None, **fields: Unpack[ReserveFields]) -> ReservationState:
        """See ``BudgetClient.reserve``."""
        request = request_of(None, fields)
        try:
            response = await self._call(self._stub.CheckAndReserve, request, timeout)
        except BudgetUnavailable:
            if self.on_unavailable == "deny":
                raise
            return ReservationState(None, request.max_output_tokens)
        if not response.allowed:
            raise denied(response)
        return ReservationState(response, request.max_output_tokens)

    async def settle(self, r: ReservationState, *, failed: bool = False) -> None:
        """See ``BudgetClient.settle``."""
        if r.response is None or r.settled is not None:
            return
        commit = r.commit_request(failed=failed)
        if commit is None:
            with contextlib.suppress(BudgetError):
                r.settled = await self.refund(r.response.reservation_id)
            return
        r.settled = await self._call(self._stub.Commit, commit, None)

    @contextlib.asynccontextmanager
    async def reservation(self, *, timeout: float | None = None, **fields: Unpack[ReserveFields]) -> AsyncIterator[ReservationState]:
        """``async with client.reservation(...) as r:`` — see
        ``BudgetClient.reservation``."""
        r = await self.reserve(timeout=timeout, **fields)
        renewer = self.keep_alive(r)
        try:
            yield r
        except BaseException:
            await self.stop_keep_alive(renewer)
            with contextlib.suppress(BudgetError):
                await self.settle(r, failed=True)
            raise
        await self.stop_keep_alive(renewer)
        await self.settle(r)

    def keep_alive(self, r: ReservationState) -> asyncio.Task[None] | None:
        """Renews ``r``'s lease at a third of its TTL until cancelled (None:
        nothing to renew)."""
        every = r.renew_every_s()
        reservation_id = r.reservation_id
        if every is None or reservation_id is None:
            return None

        async def run() -> None:
            while True:
                await asyncio.sleep(every)
                try:
                    renewed = await self.renew_lease(reservation_id, r.lease_ttl_ms)
                except BudgetError:
                    continue
                if renewed.outcome != pb.OUTCOME_APPLIED:
                    return  # settled, lapsed or gone: nothing left to keep alive

        return asyncio.get_running_loop().create_task(run())

    @staticmethod
    async def stop_keep_alive(task: asyncio.Task[None] | None) -> None:
        """Stops a ``keep_alive`` task (None: nothing to stop)."""
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
