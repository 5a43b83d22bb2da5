"""What the sync and async clients share: channel options, request building,
the unavailable policy, and a reservation's state."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Literal, Mapping

import grpc

from .errors import BudgetDenied, BudgetUnavailable
from .http import http_status_and_headers
from .v1 import budget_pb2 as pb

OnUnavailable = Literal["deny", "allow"]

# Codes that mean "ctxbudget did not decide": the unavailable policy applies.
UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


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


def metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _text(content: Any) -> str:
    """An OpenAI message content (a string, or a list of parts) as text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def messages_of(messages: Iterable[Any]) -> list[pb.Message]:
    out = []
    for m in messages:
        if isinstance(m, pb.Message):
            out.append(m)
        else:
            out.append(pb.Message(role=str(m.get("role", "")), content=_text(m.get("content")), name=str(m.get("name") or "")))
    return out


_PRIORITIES = {"critical": pb.PRIORITY_CRITICAL, "normal": pb.PRIORITY_NORMAL, "batch": pb.PRIORITY_BATCH}


def reserve_request(
    *,
    tenant: str,
    user: str = "",
    tier: str,
    model: str = "",
    messages: Iterable[Any] | None = None,
    prompt: str | None = None,
    prompt_tokens: int | None = None,
    max_output_tokens: int = 0,
    idempotency_key: str = "",
    lease_ttl_ms: int | None = None,
    allow_reduced_output: bool = False,
    min_output_tokens: int = 0,
    priority: str | int | None = None,
) -> pb.CheckAndReserveRequest:
    """A ``CheckAndReserveRequest``: the prompt as ``messages``, a ``prompt``
    string, or its token count (``prompt_tokens``)."""
    if sum(x is not None for x in (messages, prompt, prompt_tokens)) != 1:
        raise ValueError("pass exactly one of messages, prompt or prompt_tokens")
    req = pb.CheckAndReserveRequest(
        tenant_id=tenant,
        user_id=user or "",
        tier=tier,
        model=model or "",
        max_output_tokens=max_output_tokens,
        idempotency_key=idempotency_key,
        allow_reduced_output=allow_reduced_output,
        min_output_tokens=min_output_tokens,
    )
    if messages is not None:
        req.messages.extend(messages_of(messages))
    elif prompt is not None:
        req.prompt = prompt
    else:
        req.prompt_tokens = prompt_tokens
    if lease_ttl_ms is not None:
        req.lease_ttl_ms = lease_ttl_ms
    if isinstance(priority, str):
        req.priority = _PRIORITIES[priority]
    elif priority is not None:
        req.priority = priority
    return req


def denied(response: pb.CheckAndReserveResponse) -> BudgetDenied:
    status, headers = http_status_and_headers(response)
    return BudgetDenied(response, status, headers)


def unavailable(policy: OnUnavailable, error: grpc.RpcError) -> None:
    """Raises unless ``policy`` lets the request through without a budget."""
    if policy == "allow":
        return
    raise BudgetUnavailable(f"{error.code().name}: {error.details()}") from error


@dataclasses.dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0


class ReservationState:
    """A reservation the context manager holds: what was granted, and the
    usage to commit."""

    def __init__(self, response: pb.CheckAndReserveResponse | None, max_output_tokens: int):
        #: The full response (None when ctxbudget was unreachable and
        #: ``on_unavailable="allow"`` let the call through).
        self.response = response
        self._max_output_tokens = max_output_tokens
        self.usage: Usage | None = None
        #: The Commit's (or Refund's) response, once settled.
        self.settled: pb.CommitResponse | pb.RefundResponse | None = None

    @property
    def reservation_id(self) -> str | None:
        return self.response.reservation_id if self.response else None

    @property
    def granted_max_output_tokens(self) -> int:
        """What goes upstream as ``max_tokens``."""
        if self.response is None:
            return self._max_output_tokens
        return self.response.granted_max_output_tokens

    @property
    def headers(self) -> dict[str, str]:
        """``x-ratelimit-*`` headers for the gateway's own answer."""
        return http_status_and_headers(self.response)[1] if self.response else {}

    def set_usage(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> None:
        """The real usage: committed when the block exits cleanly."""
        self.usage = Usage(prompt_tokens, completion_tokens, cached_prompt_tokens)

    def commit_request(self) -> pb.CommitRequest:
        assert self.usage is not None and self.response is not None
        return pb.CommitRequest(
            reservation_id=self.response.reservation_id,
            prompt_tokens=self.usage.prompt_tokens,
            completion_tokens=self.usage.completion_tokens,
            cached_prompt_tokens=self.usage.cached_prompt_tokens,
        )

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
