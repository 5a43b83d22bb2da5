"""``BudgetClient``: every RPC of ctxbudget over a blocking gRPC channel, and
``reservation()``, the reserve → call → commit/refund flow as a ``with`` block."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import grpc

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


class BudgetClient:
    """A client of one ctxbudget service.

    Args:
        target: ``"host:port"``, e.g. ``"127.0.0.1:50051"``.
        token: a bearer token (the service's ``[auth]``), if it needs one.
        timeout: each call's deadline, seconds.
        tls: ``Tls(...)`` to connect over TLS (mutual with a client
            certificate); None: plaintext.
        on_unavailable: what ``reservation()`` does when ctxbudget cannot be
            reached or does not answer in time: ``"deny"`` raises
            ``BudgetUnavailable`` (answer 503), ``"allow"`` lets the call
            through unbudgeted (fail open).
        channel: an existing channel instead of ``target``/``tls``.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        timeout: float = 2.0,
        tls: Tls | None = None,
        on_unavailable: OnUnavailable = "deny",
        channel: grpc.Channel | None = None,
    ):
        if on_unavailable not in ("deny", "allow"):
            raise ValueError(f"on_unavailable={on_unavailable!r}: 'deny' or 'allow'")
        if channel is None:
            if tls is None:
                channel = grpc.insecure_channel(target)
            else:
                channel = grpc.secure_channel(target, tls.credentials(), options=tls.options())
        self._channel = channel
        self._stub = rpc.BudgetServiceStub(channel)
        self._metadata = metadata(token)
        self.timeout = timeout
        self.on_unavailable: OnUnavailable = on_unavailable

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> BudgetClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: float | None) -> Any:
        return method(request, timeout=timeout or self.timeout, metadata=self._metadata)

    def check_and_reserve(self, request: pb.CheckAndReserveRequest | None = None, *, timeout: float | None = None, **fields: Any) -> pb.CheckAndReserveResponse:
        """CheckAndReserve: a request message, or its fields as keywords
        (``tenant=``, ``tier=``, ``messages=`` | ``prompt_tokens=`` …)."""
        if request is None:
            request = reserve_request(**fields)
        return self._call(self._stub.CheckAndReserve, request, timeout)

    def commit(self, reservation_id: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0, *, timeout: float | None = None) -> pb.CommitResponse:
        return self._call(
            self._stub.Commit,
            pb.CommitRequest(
                reservation_id=reservation_id,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_prompt_tokens=cached_prompt_tokens,
            ),
            timeout,
        )

    def refund(self, reservation_id: str, *, timeout: float | None = None) -> pb.RefundResponse:
        return self._call(self._stub.Refund, pb.RefundRequest(reservation_id=reservation_id), timeout)

    def renew_lease(self, reservation_id: str, lease_ttl_ms: int | None = None, *, timeout: float | None = None) -> pb.RenewLeaseResponse:
        req = pb.RenewLeaseRequest(reservation_id=reservation_id)
        if lease_ttl_ms is not None:
            req.lease_ttl_ms = lease_ttl_ms
        return self._call(self._stub.RenewLease, req, timeout)

    def get_status(self, tenant: str, tier: str, user: str = "", model: str = "", *, timeout: float | None = None) -> pb.GetStatusResponse:
        return self._call(
            self._stub.GetStatus,
            pb.GetStatusRequest(tenant_id=tenant, user_id=user, tier=tier, model=model),
            timeout,
        )

    def get_estimator(self, model: str = "", *, timeout: float | None = None) -> pb.GetEstimatorResponse:
        return self._call(self._stub.GetEstimator, pb.GetEstimatorRequest(model=model), timeout)

    @contextlib.contextmanager
    def reservation(self, **fields: Any) -> Iterator[ReservationState]:
        """Reserves (raising ``BudgetDenied`` when denied), yields the
        reservation, then commits the usage given to ``set_usage`` on a
        clean exit, or refunds on an exception or without usage. The lease
        is renewed in the background at a third of its TTL while the block
        runs."""
        try:
            response = self.check_and_reserve(**fields)
        except grpc.RpcError as e:
            if e.code() not in UNAVAILABLE_CODES:
                raise
            unavailable(self.on_unavailable, e)
            yield ReservationState(None, fields.get("max_output_tokens", 0))
            return
        if not response.allowed:
            raise denied(response)
        r = ReservationState(response, fields.get("max_output_tokens", 0))
        stop = threading.Event()
        renewer = self._renewer(r, stop)
        try:
            yield r
        except BaseException:
            stop.set()
            r.settled = self._settle_quietly(lambda: self.refund(r.reservation_id))
            raise
        finally:
            stop.set()
            if renewer is not None:
                renewer.join()
        if r.usage is None:
            r.settled = self._settle_quietly(lambda: self.refund(r.reservation_id))
        else:
            r.settled = self._call(self._stub.Commit, r.commit_request(), None)

    def _renewer(self, r: ReservationState, stop: threading.Event) -> threading.Thread | None:
        every = r.renew_every_s()
        if every is None:
            return None

        def run() -> None:
            while not stop.wait(every):
                try:
                    renewed = self.renew_lease(r.reservation_id, r.lease_ttl_ms)
                except grpc.RpcError:
                    # The next renewal (or the settle) tries again.
                    continue
                if renewed.outcome != pb.OUTCOME_APPLIED:
                    return  # settled, lapsed or gone: nothing left to keep alive

        t = threading.Thread(target=run, name="ctxbudget-renew", daemon=True)
        t.start()
        return t

    @staticmethod
    def _settle_quietly(settle: Any) -> Any:
        """A refund on the way out of a failed block: its error must not hide
        the block's (an unanswered refund lapses with the lease)."""
        try:
            return settle()
        except grpc.RpcError:
            return None
