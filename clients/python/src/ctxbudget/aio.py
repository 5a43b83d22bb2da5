"""``AsyncBudgetClient``: every RPC of ctxbudget on an asyncio gRPC channel,
and ``reservation()`` as an ``async with`` block."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import grpc
import grpc.aio

from ._common import (
    UNAVAILABLE_CODES,
    OnUnavailable,
    ReservationState,
    Tls,
    denied,
    metadata,
    reserve_request,
    unavailable,
)
from .v1 import budget_pb2 as pb
from .v1 import budget_pb2_grpc as rpc


class AsyncBudgetClient:
    """The asyncio twin of ``BudgetClient`` (same arguments)."""

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
        if on_unavailable not in ("deny", "allow"):
            raise ValueError(f"on_unavailable={on_unavailable!r}: 'deny' or 'allow'")
        self._target, self._tls = target, tls
        # Made on first use, in the event loop that uses it (an asyncio
        # channel belongs to the loop it was made in: a client built at
        # import time would otherwise fail in the server's loop).
        self._channel: grpc.aio.Channel | None = channel
        self._stub_: rpc.BudgetServiceStub | None = rpc.BudgetServiceStub(channel) if channel else None
        self._metadata = metadata(token)
        self.timeout = timeout
        self.on_unavailable: OnUnavailable = on_unavailable

    @property
    def _stub(self) -> rpc.BudgetServiceStub:
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

    async def __aenter__(self) -> AsyncBudgetClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        return await method(request, timeout=timeout or self.timeout, metadata=self._metadata)

    async def check_and_reserve(self, request: pb.CheckAndReserveRequest | None = None, *, timeout: float | None = None, **fields: Any) -> pb.CheckAndReserveResponse:
        if request is None:
            request = reserve_request(**fields)
        return await self._call(self._stub.CheckAndReserve, request, timeout)

    async def commit(self, reservation_id: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0, *, timeout: float | None = None) -> pb.CommitResponse:
        return await self._call(
            self._stub.Commit,
            pb.CommitRequest(
                reservation_id=reservation_id,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_prompt_tokens=cached_prompt_tokens,
            ),
            timeout,
        )

    async def refund(self, reservation_id: str, *, timeout: float | None = None) -> pb.RefundResponse:
        return await self._call(self._stub.Refund, pb.RefundRequest(reservation_id=reservation_id), timeout)

    async def renew_lease(self, reservation_id: str, lease_ttl_ms: int | None = None, *, timeout: float | None = None) -> pb.RenewLeaseResponse:
        req = pb.RenewLeaseRequest(reservation_id=reservation_id)
        if lease_ttl_ms is not None:
            req.lease_ttl_ms = lease_ttl_ms
        return await self._call(self._stub.RenewLease, req, timeout)

    async def get_status(self, tenant: str, tier: str, user: str = "", model: str = "", *, timeout: float | None = None) -> pb.GetStatusResponse:
        return await self._call(
            self._stub.GetStatus,
            pb.GetStatusRequest(tenant_id=tenant, user_id=user, tier=tier, model=model),
            timeout,
        )

    async def get_estimator(self, model: str = "", *, timeout: float | None = None) -> pb.GetEstimatorResponse:
        return await self._call(self._stub.GetEstimator, pb.GetEstimatorRequest(model=model), timeout)

    async def reserve(self, **fields: Any) -> ReservationState:
        """Reserves, raising ``BudgetDenied`` when denied (or
        ``BudgetUnavailable`` per ``on_unavailable``): the first half of
        ``reservation()``, for callers whose call outlives one block (a
        streamed response). Settle it with ``settle()``."""
        try:
            response = await self.check_and_reserve(**fields)
        except grpc.aio.AioRpcError as e:
            if e.code() not in UNAVAILABLE_CODES:
                raise
            unavailable(self.on_unavailable, e)
            return ReservationState(None, fields.get("max_output_tokens", 0))
        if not response.allowed:
            raise denied(response)
        return ReservationState(response, fields.get("max_output_tokens", 0))

    async def settle(self, r: ReservationState, *, failed: bool = False) -> None:
        """Commits ``r``'s usage, or refunds when ``failed`` or without usage.
        A refund's error is swallowed (the lease lapses on its own); a
        commit's is raised."""
        if r.response is None or r.settled is not None:
            return
        if failed or r.usage is None:
            try:
                r.settled = await self.refund(r.reservation_id)
            except grpc.aio.AioRpcError:
                pass
            return
        r.settled = await self._call(self._stub.Commit, r.commit_request(), None)

    @contextlib.asynccontextmanager
    async def reservation(self, **fields: Any) -> AsyncIterator[ReservationState]:
        """``async with client.reservation(...) as r:`` — see
        ``BudgetClient.reservation``."""
        r = await self.reserve(**fields)
        renewer = self.keep_alive(r)
        try:
            yield r
        except BaseException:
            await self.stop_keep_alive(renewer)
            await self.settle(r, failed=True)
            raise
        await self.stop_keep_alive(renewer)
        await self.settle(r)

    def keep_alive(self, r: ReservationState) -> asyncio.Task[None] | None:
        """Renews ``r``'s lease at a third of its TTL until cancelled."""
        every = r.renew_every_s()
        if every is None:
            return None

        async def run() -> None:
            while True:
                await asyncio.sleep(every)
                try:
                    renewed = await self.renew_lease(r.reservation_id, r.lease_ttl_ms)
                except grpc.aio.AioRpcError:
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
