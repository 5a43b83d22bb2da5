"""What the sync and async clients share: channel options, the typed fields
of a reservation and the request built from them, deadlines, and a
reservation's state (what was granted, what reached the caller, what to
settle)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import grpc
import grpc.aio

try:  # The trace context is passed when the application uses OpenTelemetry.
    from opentelemetry import propagate as _propagate
except ImportError:  # pragma: no cover - opentelemetry-api is optional
    _propagate = None  # type: ignore[assignment]

from .errors import BudgetDenied
from .http import http_status_and_headers
from .v1 import budget_pb2 as pb

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from typing import Unpack
    else:
        from typing_extensions import Unpack

OnUnavailable = Literal["deny", "allow"]
#: The priority names ``priority=`` takes (or a ``pb.Priority`` value).
PriorityName = Literal["critical", "normal", "batch"]
_PRIORITIES = {"critical": pb.PRIORITY_CRITICAL, "normal": pb.PRIORITY_NORMAL, "batch": pb.PRIORITY_BATCH}
LimitStatusesName = Literal["all", "binding", "none"]
_LIMIT_STATUSES = {"all": pb.LIMIT_STATUSES_ALL, "binding": pb.LIMIT_STATUSES_BINDING, "none": pb.LIMIT_STATUSES_NONE}


class _ReserveRequired(TypedDict):
    tier: str


class ReserveFields(_ReserveRequired, total=False):
    """The keyword arguments of ``check_and_reserve``, ``reserve`` and
    ``reservation`` (both clients), so that a type checker catches a
    misspelled one. The tenant, user and session go by the client's short
    names or the proto's (``tenant=`` or ``tenant_id=``, ``user=`` or
    ``user_id=``, ``session=`` or ``session_id=``); the prompt is exactly one
    of ``messages``, ``prompt`` and ``prompt_tokens``.
    """

    tenant: str
    tenant_id: str
    user: str
    user_id: str
    session: str
    session_id: str
    model: str
    messages: Iterable[Mapping[str, Any] | pb.Message]
    prompt: str
    prompt_tokens: int
    max_output_tokens: int
    idempotency_key: str
    lease_ttl_ms: int
    allow_reduced_output: bool
    min_output_tokens: int
    priority: PriorityName | int
    candidate_models: Iterable[str]
    images: int
    limit_statuses: LimitStatusesName | int
    max_wait_ms: int


#: Every name ``ReserveFields`` accepts.
FIELD_NAMES = ReserveFields.__required_keys__ | ReserveFields.__optional_keys__


@dataclasses.dataclass(frozen=True)
class Tls:
    """TLS to ctxbudget: PEM bytes of the CA that signed the server (None:
    the system roots), and a client certificate and key for mutual TLS."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


class SyncStub(Protocol):
    """The generated ``BudgetServiceStub`` on a blocking channel, typed."""

    CheckAndReserve: grpc.UnaryUnaryMultiCallable[pb.CheckAndReserveRequest, pb.CheckAndReserveResponse]
    Commit: grpc.UnaryUnaryMultiCallable[pb.CommitRequest, pb.CommitResponse]
    Refund: grpc.UnaryUnaryMultiCallable[pb.RefundRequest, pb.RefundResponse]
    RenewLease: grpc.UnaryUnaryMultiCallable[pb.RenewLeaseRequest, pb.RenewLeaseResponse]
    GetStatus: grpc.UnaryUnaryMultiCallable[pb.GetStatusRequest, pb.GetStatusResponse]
    GetEstimator: grpc.UnaryUnaryMultiCallable[pb.GetEstimatorRequest, pb.GetEstimatorResponse]


class AsyncStub(Protocol):
    """The generated ``BudgetServiceStub`` on an asyncio channel, typed."""

    CheckAndReserve: grpc.aio.UnaryUnaryMultiCallable[pb.CheckAndReserveRequest, pb.CheckAndReserveResponse]
    Commit: grpc.aio.UnaryUnaryMultiCallable[pb.CommitRequest, pb.CommitResponse]
    Refund: grpc.aio.UnaryUnaryMultiCallable[pb.RefundRequest, pb.RefundResponse]
    RenewLease: grpc.aio.UnaryUnaryMultiCallable[pb.RenewLeaseRequest, pb.RenewLeaseResponse]
    GetStatus: grpc.aio.UnaryUnaryMultiCallable[pb.GetStatusRequest, pb.GetStatusResponse]
    GetEstimator: grpc.aio.UnaryUnaryMultiCallable[pb.GetEstimatorRequest, pb.GetEstimatorResponse]


def metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def traced(base: tuple[tuple[str, str], ...] | None) -> tuple[tuple[str, str], ...] | None:
    """``base`` plus the caller's current OpenTelemetry trace context (W3C
    ``traceparent`` / ``tracestate``, through the globally configured
    propagator), so that ctxbudget's span of the call joins the caller's
    trace. Unchanged when ``opentelemetry-api`` is not installed or no span
    is active."""
    if _propagate is None:
        return base
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    if "traceparent" not in carrier:
        return base
    return (base or ()) + tuple(carrier.items())


def check_timeout(timeout: float | None, what: str = "timeout") -> float | None:
    """``timeout`` if it is a usable deadline (seconds above 0) or None;
    else ValueError: a deadline of 0 would fail every call unanswered."""
    if timeout is not None and not timeout > 0:
        raise ValueError(f"{what}={timeout!r}: a deadline in seconds above 0 (None: the client's default)")
    return timeout


def check_on_unavailable(policy: str) -> OnUnavailable:
    if policy == "deny":
        return "deny"
    if policy == "allow":
        return "allow"
    raise ValueError(f"on_unavailable={policy!r}: 'deny' or 'allow'")


def text_of(content: Any) -> str:
    """A message's content as text: a string, or a list of parts (OpenAI's
    ``text`` / ``input_text`` / ``output_text`` parts, Anthropic's ``text``
    blocks; images and tools are not text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "\n".join(parts)


def messages_of(messages: Iterable[Mapping[str, Any] | pb.Message]) -> list[pb.Message]:
    out = []
    for m in messages:
        if isinstance(m, pb.Message):
            out.append(m)
        else:
            out.append(pb.Message(role=str(m.get("role", "")), content=text_of(m.get("content")), name=str(m.get("name") or "")))
    return out


def check_id(value: object, name: str) -> str:
    """``value`` if it is a string (or None: ""), else a TypeError naming the
    field: protobuf would take bytes silently and refuse a number with
    "bad argument type for built-in operation". The service checks the rest
    (1–256 bytes of UTF-8, no control characters: ``BudgetInvalidArgument``)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{name}={value!r}: an id is a str, not {type(value).__name__}")
    return value


def _alias(short: str | None, long: str | None, name: str) -> str | None:
    """The id given as ``name=`` or ``name_id=`` (the same value twice is
    fine), checked to be a string."""
    check_id(short, name)
    check_id(long, f"{name}_id")
    if short is not None and long is not None and short != long:
        raise TypeError(f"{name}={short!r} and {name}_id={long!r}: pass one of them")
    return short if short is not None else long


def _limit_statuses(which: LimitStatusesName | int) -> str:
    """The ``LimitStatuses`` name of ``which``."""
    names = ", ".join(map(repr, _LIMIT_STATUSES))
    if isinstance(which, str):
        if which not in _LIMIT_STATUSES:
            raise ValueError(f"limit_statuses={which!r}: one of {names} (or a pb.LimitStatuses value)")
        return pb.LimitStatuses.Name(_LIMIT_STATUSES[which])
    try:
        return pb.LimitStatuses.Name(which)
    except ValueError:
        raise ValueError(f"limit_statuses={which!r}: one of {names} (or a pb.LimitStatuses value)") from None


def _priority(priority: PriorityName | int) -> str:
    """The ``Priority`` name of ``priority``."""
    if isinstance(priority, str):
        if priority not in _PRIORITIES:
            raise ValueError(f"priority={priority!r}: one of {', '.join(map(repr, _PRIORITIES))} (or a pb.Priority value)")
        return pb.Priority.Name(_PRIORITIES[priority])
    try:
        return pb.Priority.Name(priority)
    except ValueError:
        raise ValueError(f"priority={priority!r}: one of {', '.join(map(repr, _PRIORITIES))} (or a pb.Priority value)") from None


def reserve_request(
    *,
    tier: str,
    tenant: str | None = None,
    tenant_id: str | None = None,
    user: str | None = None,
    user_id: str | None = None,
    session: str | None = None,
    session_id: str | None = None,
    model: str = "",
    messages: Iterable[Mapping[str, Any] | pb.Message] | None = None,
    prompt: str | None = None,
    prompt_tokens: int | None = None,
    max_output_tokens: int = 0,
    idempotency_key: str = "",
    lease_ttl_ms: int | None = None,
    allow_reduced_output: bool = False,
    min_output_tokens: int = 0,
    priority: PriorityName | int | None = None,
    candidate_models: Iterable[str] = (),
    images: int = 0,
    limit_statuses: LimitStatusesName | int | None = None,
    max_wait_ms: int = 0,
) -> pb.CheckAndReserveRequest:
    """A ``CheckAndReserveRequest`` from ``ReserveFields``: the tenant as
    ``tenant`` or ``tenant_id``, the user as ``user`` or ``user_id``, the
    session (an agent run, a trace, a conversation: the tier's ``session``
    limits apply to it, beside the user's; none: no session level) as
    ``session`` or ``session_id``, and the prompt as ``messages``, a
    ``prompt`` string, or its token count (``prompt_tokens``). ``candidate_models``: fallback models in order, the
    first with room reserved (``chosen_model`` of the response; ``model``
    then empty or the first). ``images``: how many images the call may
    generate (the tier's ``images`` limits). ``limit_statuses``: which
    limits' statuses the answer carries in ``limits``: ``"all"`` (the
    default), ``"binding"`` (per dimension the one with the least room left,
    and the one that denied) or ``"none"`` (the decision alone).
    ``max_wait_ms``: how long the call may wait in line when only the
    shared upstream account denies it (0: answer at once; the response's
    ``waited_ms`` says how long it waited, docs/queue.md)."""
    if isinstance(candidate_models, (str, bytes)):
        raise TypeError("candidate_models is a list of model names, not one string")
    the_tenant = _alias(tenant, tenant_id, "tenant")
    if the_tenant is None:
        raise TypeError("reserve_request() missing the tenant: tenant= (or tenant_id=)")
    if sum(x is not None for x in (messages, prompt, prompt_tokens)) != 1:
        raise ValueError("pass exactly one of messages, prompt or prompt_tokens")
    req = pb.CheckAndReserveRequest(
        tenant_id=the_tenant,
        user_id=_alias(user, user_id, "user") or "",
        session_id=_alias(session, session_id, "session") or "",
        tier=tier,
        model=model or "",
        max_output_tokens=max_output_tokens,
        idempotency_key=idempotency_key,
        allow_reduced_output=allow_reduced_output,
        min_output_tokens=min_output_tokens,
        priority=_priority(priority) if priority is not None else None,
        candidate_models=list(candidate_models),
        images=images,
        limit_statuses=_limit_statuses(limit_statuses) if limit_statuses is not None else None,
        max_wait_ms=max_wait_ms,
    )
    if messages is not None:
        req.messages.extend(messages_of(messages))
    elif prompt is not None:
        req.prompt = prompt
    elif prompt_tokens is not None:
        req.prompt_tokens = prompt_tokens
    if lease_ttl_ms is not None:
        req.lease_ttl_ms = lease_ttl_ms
    return req


def waiting_timeout(request: pb.CheckAndReserveRequest, timeout: float | None, default: float) -> float | None:
    """A CheckAndReserve's deadline: ``timeout`` when given, else the
    client's ``default`` plus the time the call may wait in line."""
    if timeout is not None or not request.max_wait_ms:
        return timeout
    return default + request.max_wait_ms / 1000


def status_request(tenant: str, tier: str, user: str = "", model: str = "", session: str = "") -> pb.GetStatusRequest:
    """A ``GetStatusRequest``: the tenant's budgets, and the user's and the
    session's when named (a session of no user: the session of the tenant's
    calls that name none)."""
    return pb.GetStatusRequest(
        tenant_id=check_id(tenant, "tenant"),
        user_id=check_id(user, "user"),
        session_id=check_id(session, "session"),
        tier=tier,
        model=model,
    )


def request_of(request: pb.CheckAndReserveRequest | None, fields: Mapping[str, Any]) -> pb.CheckAndReserveRequest:
    """The request a ``check_and_reserve`` call means: the message given, or
    one built from its keyword fields (an unknown name is a TypeError that
    lists the known ones)."""
    if request is not None:
        if fields:
            raise TypeError("pass a CheckAndReserveRequest or its fields as keywords, not both")
        return request
    unknown = sorted(set(fields) - FIELD_NAMES)
    if unknown:
        raise TypeError(f"unknown field(s) {', '.join(unknown)}: the fields are {', '.join(sorted(FIELD_NAMES))}")
    return reserve_request(**fields)


def denied(response: pb.CheckAndReserveResponse) -> BudgetDenied:
    status, headers = http_status_and_headers(response)
    return BudgetDenied(response, status, headers)


class CommitParts(TypedDict, total=False):
    """What a Commit may say beyond its prompt, completion and cached tokens
    (``commit`` of both clients, ``set_usage``): each is a ``CommitRequest``
    field of the same name, so a type checker catches a misspelled one."""

    #: Of the prompt, written to the provider's cache for 5 minutes.
    cache_write_prompt_tokens: int
    #: Of the prompt, written to the cache for an hour.
    cache_write_1h_prompt_tokens: int
    #: Of the completion, reasoning tokens.
    reasoning_tokens: int
    #: Images the call generated.
    images: int


#: Every name ``CommitParts`` accepts.
COMMIT_PART_NAMES = CommitParts.__optional_keys__


def commit_message(
    reservation_id: str,
    prompt_tokens: int,
    completion_tokens: int = 0,
    cached_prompt_tokens: int = 0,
    completion_text: str = "",
    parts: Mapping[str, Any] | None = None,
) -> pb.CommitRequest:
    """A ``CommitRequest``: the usage, and its ``CommitParts`` by name (an
    unknown one is a ``TypeError`` naming those it could be)."""
    parts = dict(parts or {})
    unknown = set(parts) - COMMIT_PART_NAMES
    if unknown:
        raise TypeError(f"commit() got unknown usage {sorted(unknown)}; one of {sorted(COMMIT_PART_NAMES)}")
    return pb.CommitRequest(
        reservation_id=reservation_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cached_prompt_tokens,
        completion_text=completion_text,
        **parts,
    )


@dataclasses.dataclass
class Usage:
    """The upstream's own count of a call: what Commit charges. The fields
    after ``cached_prompt_tokens`` are its ``CommitParts``."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    #: Of the prompt, written to the provider's cache for 5 minutes.
    cache_write_prompt_tokens: int = 0
    #: Of the prompt, written to the cache for an hour.
    cache_write_1h_prompt_tokens: int = 0
    #: Of the completion, reasoning tokens.
    reasoning_tokens: int = 0
    #: Images the call generated.
    images: int = 0

    def parts(self) -> dict[str, int]:
        """Its ``CommitParts``, by name."""
        return {name: getattr(self, name) for name in COMMIT_PART_NAMES}


class ReservationState:
    """A reservation held across an upstream call: what was granted, the
    usage to commit, and the output that reached the caller.

    How it settles (``settle()``, or leaving a ``reservation()`` block):

    - ``set_usage`` was called: commit that usage.
    - else output reached the caller (``record_output``): commit the prompt as
      reserved and the completion as the text delivered, which the service
      counts (``completion_text``) — a stream cut short, or one whose upstream
      sent no usage, is billed by the provider all the same.
    - else (nothing reached the caller, or the call failed before any output):
      refund.
    """

    def __init__(
        self,
        response: pb.CheckAndReserveResponse | None,
        max_output_tokens: int = 0,
    ):
        #: The full response (None when ctxbudget was unreachable and
        #: ``on_unavailable="allow"`` let the call through).
        self.response = response
        self._max_output_tokens = max_output_tokens
        self.usage: Usage | None = None
        self._output: list[str] = []
        self._delivered = False
        #: The Commit's (or Refund's) response, once settled.
        self.settled: pb.CommitResponse | pb.RefundResponse | None = None

    @property
    def reservation_id(self) -> str | None:
        return self.response.reservation_id if self.response else None

    @property
    def granted_max_output_tokens(self) -> int | None:
        """What goes upstream as ``max_tokens`` (``max_output_tokens``…).
        None for a call let through unbudgeted (``on_unavailable="allow"``)
        whose caller asked for no limit: send none upstream, not 0."""
        if self.response is None:
            return self._max_output_tokens or None
        return self.response.granted_max_output_tokens

    @property
    def reserved_prompt_tokens(self) -> int:
        """The prompt as reserved: the caller's ``prompt_tokens``, or the
        service's count × its estimator's multiplier, rounded up."""
        if self.response is None:
            return 0
        return max(self.response.reserved_tokens - self.reserved_output_tokens, 0)

    @property
    def reserved_output_tokens(self) -> int:
        """The output tokens actually reserved: the granted output, or less
        where every level holds the learned output. (A server before
        ``reserved_output_tokens`` reserved the granted output.)"""
        if self.response is None:
            return 0
        return self.response.reserved_output_tokens or self.response.granted_max_output_tokens

    @property
    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers for the gateway's own answer."""
        return http_status_and_headers(self.response)[1] if self.response else {}

    def set_usage(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        cached_prompt_tokens: int = 0,
        **parts: Unpack[CommitParts],
    ) -> None:
        """The upstream's usage: committed when the call settles. The cache
        reads and writes are parts of ``prompt_tokens``, the reasoning tokens
        of ``completion_tokens`` (each priced at its own price); the parts
        go by their ``CommitParts`` names."""
        commit_message("", prompt_tokens, parts=parts)  # an unknown part fails here, not at settle
        self.usage = Usage(prompt_tokens, completion_tokens, cached_prompt_tokens, **parts)

    def record_output(self, text: str = "") -> None:
        """Output reached the caller (a streamed chunk; ``text`` is its part
        of the completion). From then on the call commits — the usage when
        ``set_usage`` is given, else the prompt as reserved and the text
        recorded — instead of refunding."""
        self._delivered = True
        if text:
            self._output.append(text)

    @property
    def output_delivered(self) -> bool:
        """Whether any output reached the caller (``record_output``)."""
        return self._delivered

    @property
    def completion_text(self) -> str:
        """The text recorded with ``record_output``."""
        return "".join(self._output)

    def commit_request(self, *, failed: bool = False) -> pb.CommitRequest | None:
        """What settling sends: a Commit, or None for a Refund (see the
        class's doc). ``failed``: the upstream call failed, so a usage given
        counts only if output had reached the caller."""
        if self.response is None:
            return None
        if self.usage is not None and (self._delivered or not failed):
            return commit_message(
                self.response.reservation_id,
                self.usage.prompt_tokens,
                self.usage.completion_tokens,
                self.usage.cached_prompt_tokens,
                parts=self.usage.parts(),
            )
        if self._delivered:
            return pb.CommitRequest(
                reservation_id=self.response.reservation_id,
                prompt_tokens=self.reserved_prompt_tokens,
                completion_text=self.completion_text,
            )
        return None

    @property
    def lease_ttl_ms(self) -> int:
        """The lease the reservation was granted: what each renewal asks for
        again (the service's default would otherwise apply)."""
        return self.response.lease_expires_in_ms if self.response else 0

    def renew_every_s(self) -> float | None:
        """A third of the lease: how often a long call renews it."""
        if self.response is None or not self.response.lease_expires_in_ms:
            return None
        return self.response.lease_expires_in_ms / 3000
