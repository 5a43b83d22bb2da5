"""``BudgetClient``: every RPC of ctxbudget over a blocking gRPC channel,
``reserve()`` / ``settle()`` for a call that outlives one block, and
``reservation()``, the reserve → call → commit/refund flow as a ``with``
block."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

import grpc

from ._common import (
    CommitParts,
    OnUnavailable,
    ReservationState,
    ReserveFields,
    SyncStub,
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


class KeepAlive:
    """A reservation's lease renewed in a background thread, at a third of
    its TTL, until ``stop()`` (or until the lease is settled or lapsed)."""

    def __init__(self, client: BudgetClient, r: ReservationState, every: float):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, r, every), name="ctxbudget-renew", daemon=True)
        self._thread.start()

    def _run(self, client: BudgetClient, r: ReservationState, every: float) -> None:
        assert r.reservation_id is not None
        while not self._stop.wait(every):
            try:
                renewed = client.renew_lease(r.reservation_id, r.lease_ttl_ms)
            except BudgetError:
                continue  # the next renewal (or the settle) tries again
            if renewed.outcome != pb.OUTCOME_APPLIED:
                return  # settled, lapsed or gone: nothing left to keep alive

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class BudgetClient:
    """A client of one ctxbudget service.

    Args:
        target: ``"host:port"``, e.g. ``"127.0.0.1:50051"``.
        token: a bearer token (the service's ``[auth]``), if it needs one.
        timeout: each call's deadline, seconds (above 0); a call's own
            ``timeout=`` overrides it.
        tls: ``Tls(...)`` to connect over TLS (mutual with a client
            certificate); None: plaintext.
        on_unavailable: what ``reserve()`` and ``reservation()`` do when
            ctxbudget cannot be reached or does not answer in time:
            ``"deny"`` raises ``BudgetUnavailable`` (answer 503), ``"allow"``
            lets the call through unbudgeted (fail open).
        channel: an existing channel instead of ``target``/``tls``.

    Every error raised is a ``BudgetError`` (see ``ctxbudget.errors``).
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
        self.on_unavailable: OnUnavailable = check_on_unavailable(on_unavailable)
        self.timeout: float = check_timeout(timeout) or 2.0
        if channel is None:
            if tls is None:
                channel = grpc.insecure_channel(target)
            else:
                channel = grpc.secure_channel(target, tls.credentials(), options=tls.options())
        self._channel = channel
        self._stub: SyncStub = rpc.BudgetServiceStub(channel)
        self._metadata = metadata(token)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: grpc.UnaryUnaryMultiCallable[Req, Resp], request: Req, timeout: float | None) -> Resp:
        deadline = self.timeout if check_timeout(timeout) is None else timeout
        try:
            return method(request, timeout=deadline, metadata=traced(self._metadata))
        except grpc.RpcError as e:
            raise error_of(e) from e

    def check_and_reserve(
        self,
        request: pb.CheckAndReserveRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[ReserveFields],
    ) -> pb.CheckAndReserveResponse:
        """CheckAndReserve: a request message, or its fields as keywords
        (``ReserveFields``: ``tenant=``/``tenant_id=``, ``user=``/``user_id=``,
        ``session=``/``session_id=``, ``tier=``, ``model=``, ``messages=`` |
        ``prompt=`` | ``prompt_tokens=``,
        ``max_output_tokens=``, ``priority=``, ``max_wait_ms=`` …). A denial is
        a response with ``allowed`` false, not an error. Without ``timeout``,
        a call that may wait in line gets the client's deadline plus its
        ``max_wait_ms``."""
        req = request_of(request, fields)
        return self._call(self._stub.CheckAndReserve, req, waiting_timeout(req, timeout, self.timeout))

    def commit(
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
        """Commit the real usage; ``completion_text`` instead of
        ``completion_tokens`` when the upstream reported none (the service
        counts it). The cache reads and writes are parts of ``prompt_tokens``
        (add Anthropic's ``input_tokens``, ``cache_creation_input_tokens`` and
        ``cache_read_input_tokens`` into it); ``reasoning_tokens`` part of
        ``completion_tokens``; each priced at the model group's price for it.
        The keyword parts are ``CommitParts``."""
        req = commit_message(reservation_id, prompt_tokens, completion_tokens, cached_prompt_tokens, completion_text, parts)
        return self._call(self._stub.Commit, req, timeout)

    def refund(self, reservation_id: str, *, timeout: float | None = None) -> pb.RefundResponse:
        """Return a reservation's request and tokens and free its slot
        (idempotent)."""
        return self._call(self._stub.Refund, pb.RefundRequest(reservation_id=reservation_id), timeout)

    def renew_lease(self, reservation_id: str, lease_ttl_ms: int | None = None, *, timeout: float | None = None) -> pb.RenewLeaseResponse:
        """Extend a live reservation's concurrency lease (``lease_ttl_ms``
        from now; None: the service's default)."""
        req = pb.RenewLeaseRequest(reservation_id=reservation_id)
        if lease_ttl_ms is not None:
            req.lease_ttl_ms = lease_ttl_ms
        return self._call(self._stub.RenewLease, req, timeout)

    def get_status(
        self, tenant: str, tier: str, user: str = "", model: str = "", *, session: str = "", timeout: float | None = None
    ) -> pb.GetStatusResponse:
        """Read the budgets of a tenant (and user, and session, and model
        group) without reserving anything. ``session``: also the
        ``LEVEL_SESSION`` entries of that session of ``user``."""
        return self._call(self._stub.GetStatus, status_request(tenant, tier, user, model, session), timeout)

    def get_estimator(self, model: str = "", *, timeout: float | None = None) -> pb.GetEstimatorResponse:
        """The adaptive token estimator's multipliers and samples (one
        model's key, or every key)."""
        return self._call(self._stub.GetEstimator, pb.GetEstimatorRequest(model=model), timeout)

    def reserve(self, *, timeout: float | None = None, **fields: Unpack[ReserveFields]) -> ReservationState:
        """Reserves, raising ``BudgetDenied`` when denied (or
        ``BudgetUnavailable`` per ``on_unavailable``): the first half of
        ``reservation()``, for a call that outlives one block (a streamed
        response). Settle it with ``settle()``; ``keep_alive()`` renews its
        lease meanwhile."""
        request = request_of(None, fields)
        try:
            response = self._call(self._stub.CheckAndReserve, request, timeout)
        except BudgetUnavailable:
            if self.on_unavailable == "deny":
                raise
            return ReservationState(None, request.max_output_tokens)
        if not response.allowed:
            raise denied(response)
        return ReservationState(response, request.max_output_tokens)

    def settle(self, r: ReservationState, *, failed: bool = False) -> None:
        """Commits or refunds ``r`` as ``ReservationState`` says (usage given;
        else output delivered; else refund). ``failed``: the upstream call
        failed. A refund's error is swallowed (the lease lapses on its own);
        a commit's is raised."""
        if r.response is None or r.settled is not None:
            return
        commit = r.commit_request(failed=failed)
        if commit is None:
            with contextlib.suppress(BudgetError):
                r.settled = self.refund(r.response.reservation_id)
            return
        r.settled = self._call(self._stub.Commit, commit, None)

    def keep_alive(self, r: ReservationState) -> KeepAlive | None:
        """Renews ``r``'s lease at a third of its TTL until stopped (None:
        nothing to renew)."""
        every = r.renew_every_s()
        return None if every is None else KeepAlive(self, r, every)

    @staticmethod
    def stop_keep_alive(keep: KeepAlive | None) -> None:
        """Stops a ``keep_alive`` renewal (None: nothing to stop)."""
        if keep is not None:
            keep.stop()

    @contextlib.contextmanager
    def reservation(self, *, timeout: float | None = None, **fields: Unpack[ReserveFields]) -> Iterator[ReservationState]:
        """Reserves (raising ``BudgetDenied`` when denied), yields the
        reservation, and settles it on the way out: the usage given to
        ``set_usage``; else, when output reached the caller
        (``record_output``), the prompt as reserved and the text delivered;
        else — an exception before any output, or no output at all — a
        refund. The lease is renewed in the background at a third of its TTL
        while the block runs."""
        r = self.reserve(timeout=timeout, **fields)
        keep = self.keep_alive(r)
        try:
            yield r
        except BaseException:
            self.stop_keep_alive(keep)
            # The block's error matters more than the settle's.
            with contextlib.suppress(BudgetError):
                self.settle(r, failed=True)
            raise
        self.stop_keep_alive(keep)
        self.settle(r)
