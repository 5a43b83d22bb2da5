"""ctxbudget in the LiteLLM proxy: exact limits across every proxy instance.

One line in LiteLLM's ``config.yaml`` (and settings as environment
variables, which LiteLLM's ``environment_variables:`` block can set)::

    litellm_settings:
      callbacks: ctxbudget.litellm.handler
    environment_variables:
      CTXBUDGET_TARGET: "127.0.0.1:50051"
      CTXBUDGET_TENANT_FROM: "team_id"        # where the tenant, user and tier come from
      CTXBUDGET_USER_FROM: "user_id"
      CTXBUDGET_TIER_FROM: "metadata.tier"
      CTXBUDGET_DEFAULT_TIER: "free"
      CTXBUDGET_SESSION_FROM: "litellm"      # the session level: LiteLLM's session/trace id

Before each chat or text completion, Responses API call
(``/v1/responses``) or Anthropic-format message (``/v1/messages``) the hook
reserves with ctxbudget and caps the call's output at what was granted
(``max_tokens`` / ``max_completion_tokens``, ``max_output_tokens`` for the
Responses API); a denial refuses the call with HTTP 429 (or 413, or 403 for
a blocked tenant) and ``Retry-After`` / ``x-ratelimit-*`` headers, and any
other ctxbudget error maps as ``ctxbudget.errors`` says (400 for the caller's
mistakes such as an unknown tier or a malformed id, 503 when ctxbudget does
not answer). After a success it commits the real usage (for a stream, the
usage LiteLLM assembled from its final chunk). A call that fails before any
output reached the caller is refunded; a stream that fails after chunks went
out is committed — the prompt as reserved and the completion counted by
ctxbudget from the text delivered — since the provider bills it.

Streams pass through the hook's iterator hook, which records the text of
every chunk that reached the caller. A caller that disconnects mid-stream is
reported by LiteLLM as a success with the usage of the chunks so far
(committed); a stream that stops without any report is settled
``STREAM_SETTLE_AFTER_S`` later (committed if anything was delivered, else
refunded).

When LiteLLM's own retries are on, a failed attempt is logged as a failure
and a later attempt of the same call may still succeed: so a logged failure
only stops renewing the lease and schedules the settle ``REFUND_AFTER_S``
later, which a success (commit) or the proxy's final failure hook (at once)
overtakes. Reservations are found by a token the hook writes into LiteLLM's
own metadata (``litellm_metadata`` on the routes whose ``metadata`` is the
provider's, so it never goes upstream), never by anything the caller sent: a
caller's own metadata key of the hook's names is dropped.

Settings (environment):

- ``CTXBUDGET_TARGET`` (``127.0.0.1:50051``), ``CTXBUDGET_TOKEN`` (bearer),
  ``CTXBUDGET_TIMEOUT`` (seconds above 0, 2), ``CTXBUDGET_ON_UNAVAILABLE``
  (``deny``: 503, or ``allow``: let calls through unbudgeted, with the
  caller's own output cap or none).
- ``CTXBUDGET_TENANT_FROM``, ``CTXBUDGET_USER_FROM``, ``CTXBUDGET_TIER_FROM``:
  which field of the caller's key names each, from LiteLLM's
  ``UserAPIKeyAuth``: an attribute (``team_id``, ``user_id``, ``key_alias``,
  ``token``…) or ``metadata.<name>`` / ``team_metadata.<name>``; or
  ``request.<name>`` for the request's own ``metadata`` (or ``user`` for the
  request's ``user`` field). Defaults: tenant ``team_id`` (else the key's
  hash), user ``user_id``, tier ``metadata.tier``.
- ``CTXBUDGET_DEFAULT_TIER``: the tier when none is named (``default``).
- ``CTXBUDGET_SESSION_FROM``: the session of each call (an agent run, a
  trace, a conversation), whose tier's ``session`` limits apply beside the
  user's (``check_and_reserve(session=...)``). ``none`` or the empty string:
  no session level. A path as for the user (``request.<name>``,
  ``metadata.<name>``…). Unset, or ``litellm``: the session LiteLLM itself
  resolved for the call, read from the request data its pre-call hook gets,
  the first non-empty string of

  1. ``litellm_session_id``, at the top level of the request data: the
     request body's own ``litellm_session_id`` field, or what the proxy put
     there from the ``x-litellm-session-id`` / ``x-litellm-trace-id`` headers
     (or another ``x-*-session-id`` header), from Claude Code's
     ``metadata.user_id`` (``…_session_<id>``) on ``/v1/messages``, or from a
     W3C ``baggage: session.id=…`` header
     (``litellm/proxy/litellm_pre_call_utils.py``,
     ``add_litellm_data_to_request``);
  2. ``session_id`` in LiteLLM's metadata of the call (``litellm_metadata``
     on the routes whose ``metadata`` is the provider's, ``/v1/responses`` and
     ``/v1/messages``, where LiteLLM copies the caller's ``metadata.session_id``
     into it; else ``metadata``), then in the request's ``metadata``;
  3. ``trace_id`` in the same metadata (the caller's ``metadata.trace_id``,
     or the trace id of a W3C ``traceparent`` header), then
     ``existing_trace_id`` (Langfuse's: a call joining an existing trace).

  LiteLLM's own order (``litellm/litellm_core_utils/get_litellm_params.py``:
  ``litellm_session_id``, else ``metadata.session_id``, else
  ``metadata.trace_id``), so the session limited is the one LiteLLM's logs
  show. A session id LiteLLM made up for a call that named none
  (``general_settings.missing_session_id: generate`` marks it
  ``litellm_session_id_generated`` in the metadata) is not a session: steps
  1 and 2 are skipped then. With OpenTelemetry on, LiteLLM may put its own
  span's trace id in ``metadata.trace_id``: each call is then a session of
  its own unless the caller propagates one trace across its run (set
  ``request.session_id`` to count only sessions the caller named).

  The session comes from what the caller sent, and that is fine: a session
  is a scope inside the caller's own user (the same id under two users is
  two sessions), so naming one can only add limits to the caller's calls,
  never lift the user's or tenant's, nor spend another user's. Session
  limits bound a caller's runaway agent loop; a caller that wants to dodge
  them can name a new session each call. A malformed session id (control
  characters, over 256 bytes) is the caller's error: a 400 naming
  ``session_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from fastapi import HTTPException

from ._common import ReservationState, Usage, check_on_unavailable, text_of
from .aio import AsyncBudgetClient
from .errors import BudgetDenied, BudgetError

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as e:  # pragma: no cover - the hook is for the proxy only
    raise ImportError("ctxbudget.litellm needs LiteLLM: pip install 'litellm[proxy]'") from e

_CHAT_CALLS = {"completion", "acompletion", "text_completion", "atext_completion"}
_RESPONSES_CALLS = {"responses", "aresponses"}
_ANTHROPIC_CALLS = {"anthropic_messages", "aanthropic_messages"}
# The calls that carry a prompt and produce tokens.
BUDGETED_CALLS = _CHAT_CALLS | _RESPONSES_CALLS | _ANTHROPIC_CALLS
_KEY = "ctxbudget_reservation_id"
# The hook's own handle on a call, in the call's metadata: LiteLLM's call id
# can be set by the caller (x-litellm-call-id), so it is not trusted.
_TOKEN = "ctxbudget_hook_token"
# Where LiteLLM keeps a call's metadata: "metadata", or "litellm_metadata" on
# the routes where "metadata" is a field of the provider's API.
_METADATA = ("litellm_metadata", "metadata")
#: ``session_from``'s default: the session LiteLLM resolved (the module doc).
LITELLM_SESSION = "litellm"
# What LiteLLM marks a session id with that it generated for a call naming
# none (``litellm.constants.SESSION_ID_GENERATED_METADATA_KEY``).
_GENERATED_SESSION = "litellm_session_id_generated"

#: How long after a logged failure the reservation is settled unless the
#: call's retry succeeds first (seconds).
REFUND_AFTER_S = 30.0
#: How long after a stream ended early (the caller gone, the upstream cut)
#: the reservation is settled unless LiteLLM reports the call first: its
#: failure hook, or the success event it sends for a disconnected stream.
STREAM_SETTLE_AFTER_S = 5.0


def _lookup(path: str, key: Any, data: dict[str, Any]) -> str:
    """The value ``path`` names (see the module doc), "" when absent."""
    if path.startswith("request."):
        name = path.removeprefix("request.")
        if name == "user":
            return str(data.get("user") or "")
        meta = data.get("metadata") or {}
        return str(meta.get(name) or "")
    head, _, rest = path.partition(".")
    value = getattr(key, head, None)
    if rest:
        value = (value or {}).get(rest) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _litellm_session(data: Mapping[str, Any]) -> str:
    """The session LiteLLM resolved for a call, "" when none (the module doc
    has the fields and their order)."""
    metas = [m for m in (data.get(name) for name in _METADATA) if isinstance(m, Mapping)]
    generated = any(m.get(_GENERATED_SESSION) for m in metas)
    sessions = [] if generated else [data.get("litellm_session_id"), *(m.get("session_id") for m in metas)]
    traces = [m.get(name) for name in ("trace_id", "existing_trace_id") for m in metas]
    # Strings only, as LiteLLM counts them (a number or an object is no id).
    return next((v for v in (*sessions, *traces) if isinstance(v, str) and v), "")


def _output_field(call_type: str, data: Mapping[str, Any]) -> str:
    """The request field that caps the call's output."""
    if call_type in _RESPONSES_CALLS:
        return "max_output_tokens"
    if call_type in _CHAT_CALLS and "max_completion_tokens" in data:
        return "max_completion_tokens"
    return "max_tokens"


def _prompt(call_type: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The prompt to count, as ``messages=`` or ``prompt=``."""
    messages: list[dict[str, Any]] = []
    if call_type in _ANTHROPIC_CALLS and data.get("system"):
        messages.append({"role": "system", "content": text_of(data["system"])})
    if call_type in _RESPONSES_CALLS:
        if data.get("instructions"):
            messages.append({"role": "system", "content": str(data["instructions"])})
        items = data.get("input")
        if isinstance(items, str) or items is None:
            messages.append({"role": "user", "content": items or ""})
        else:
            for item in items:
                if not isinstance(item, Mapping):
                    messages.append({"role": "user", "content": str(item)})
                elif "content" in item:
                    messages.append({"role": str(item.get("role") or "user"), "content": text_of(item["content"])})
                else:  # a tool call or its output
                    messages.append({"role": "tool", "content": str(item.get("output") or item.get("arguments") or "")})
        return {"messages": messages}
    if data.get("messages") is not None:
        return {"messages": messages + [dict(m) for m in data["messages"]]}
    text = data.get("prompt") or data.get("input") or ""
    return {"prompt": text if isinstance(text, str) else " ".join(map(str, text))}


class CtxBudgetHook(CustomLogger):
    """The LiteLLM proxy hook (``callbacks: ctxbudget.litellm.handler``)."""

    def __init__(self, client: AsyncBudgetClient | None = None, **settings: str):
        super().__init__()
        self._client = client
        self._settings = settings
        # Reservations in flight in this process, by the hook's token: the
        # reservation and the task that renews (or later settles) it.
        self._open: dict[str, tuple[ReservationState, asyncio.Task[None] | None]] = {}

    def _setting(self, name: str, default: str) -> str:
        return self._settings.get(name) or os.environ.get(f"CTXBUDGET_{name.upper()}") or default

    def _session(self, key: Any, data: dict[str, Any]) -> str:
        """The call's session (``session_from``): unlike the other settings,
        an empty value given switches it off rather than meaning the
        default."""
        given = self._settings.get("session_from", os.environ.get("CTXBUDGET_SESSION_FROM"))
        source = LITELLM_SESSION if given is None else given.strip()
        if source.lower() in ("", "none"):
            return ""
        if source == LITELLM_SESSION:
            return _litellm_session(data)
        return _lookup(source, key, data)

    @property
    def client(self) -> AsyncBudgetClient:
        # Made on first use: LiteLLM sets the configuration's
        # environment_variables after importing the callback.
        if self._client is None:
            self._client = AsyncBudgetClient(
                self._setting("target", "127.0.0.1:50051"),
                token=self._setting("token", "") or None,
                timeout=float(self._setting("timeout", "2")),
                on_unavailable=check_on_unavailable(self._setting("on_unavailable", "deny")),
            )
        return self._client

    def _who(self, key: Any, data: dict[str, Any]) -> tuple[str, str, str, str]:
        """The call's tenant, user, session and tier."""
        tenant = _lookup(self._setting("tenant_from", "team_id"), key, data)
        if not tenant:
            tenant = str(getattr(key, "token", "") or getattr(key, "api_key", "") or "anonymous")
        user = _lookup(self._setting("user_from", "user_id"), key, data)
        tier = _lookup(self._setting("tier_from", "metadata.tier"), key, data) or self._setting("default_tier", "default")
        return tenant, user, self._session(key, data), tier

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        # The caller's request metadata merges into LiteLLM's: never trust a
        # reservation id found there. (The session read from it below is the
        # caller's to name: it only narrows the caller's own budget.)
        for name in _METADATA:
            if isinstance(data.get(name), dict):
                data[name].pop(_KEY, None)
                data[name].pop(_TOKEN, None)
        call = str(getattr(call_type, "value", call_type))
        if call not in BUDGETED_CALLS:
            return data
        tenant, user, session, tier = self._who(user_api_key_dict, data)
        field = _output_field(call, data)
        asked = (data.get("max_completion_tokens") or data.get("max_tokens")) if call in _CHAT_CALLS else data.get(field)
        try:
            with _callers_trace(data):
                r = await self.client.reserve(
                    tenant=tenant, user=user, session=session, tier=tier, model=str(data.get("model") or ""),
                    max_output_tokens=int(asked or 0), **_prompt(call, data),
                )
        except BudgetDenied as d:
            raise HTTPException(status_code=d.http_status, detail=d.response.detail or d.reason, headers=d.headers) from d
        except BudgetError as e:
            raise HTTPException(status_code=e.http_status, detail=str(e), headers=e.headers or None) from e
        granted = r.granted_max_output_tokens
        if r.reservation_id is None or granted is None:
            return data  # ctxbudget unreachable, on_unavailable = allow: the caller's own cap, if any
        data[field] = granted
        token = uuid.uuid4().hex
        # LiteLLM's own metadata: "litellm_metadata" on the routes whose
        # "metadata" is the provider's (the Responses API, /v1/messages),
        # which must not carry the hook's keys upstream.
        meta = data.setdefault("litellm_metadata" if isinstance(data.get("litellm_metadata"), dict) else "metadata", {})
        meta[_KEY], meta[_TOKEN] = r.reservation_id, token
        self._open[token] = (r, self.client.keep_alive(r))
        return data

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict[str, Any]
    ) -> AsyncIterator[Any]:
        """Passes a stream through, recording the text each chunk carried to
        the caller: a stream that ends early commits what was delivered."""
        token = self._token(request_data)
        found = self._open.get(token)
        finished = False
        try:
            async for chunk in response:
                yield chunk
                if found is not None:
                    found[0].record_output(_chunk_text(chunk))
            finished = True
        finally:
            if not finished and found is not None and self._open.get(token, (None,))[0] is found[0]:
                # Cut short (the caller gone, or the upstream broken):
                # LiteLLM's own report of the call settles it first if it
                # comes; else this does.
                self._settle_later(token, found[0], STREAM_SETTLE_AFTER_S)

    @staticmethod
    def _token(call: dict[str, Any]) -> str:
        """The hook's token of a call, from the metadata it wrote (in the
        request data, or in a logging event's litellm_params)."""
        params = call.get("litellm_params") or {}
        for meta in (*(params.get(name) for name in _METADATA), *(call.get(name) for name in _METADATA)):
            if isinstance(meta, dict) and meta.get(_TOKEN):
                return str(meta[_TOKEN])
        return ""

    def _take(self, call: dict[str, Any]) -> ReservationState | None:
        """The reservation of a finished call (the same token for every
        attempt), if this process holds it."""
        found = self._open.pop(self._token(call), None)
        if found is None:
            return None
        r, task = found
        if task is not None:
            task.cancel()
        return r

    def _settle_later(self, token: str, r: ReservationState, delay: float) -> None:
        """Stops renewing ``r`` and settles it (as failed) after ``delay``
        seconds, unless the call is settled first."""
        _, task = self._open[token]
        if task is not None:
            task.cancel()

        async def settle_later() -> None:
            await asyncio.sleep(delay)
            if self._open.get(token, (None,))[0] is r:
                del self._open[token]
                await self.client.settle(r, failed=True)

        self._open[token] = (r, asyncio.get_running_loop().create_task(settle_later()))

    async def async_log_success_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        r = self._take(kwargs)
        if r is None:
            return
        usage = _usage(kwargs, response_obj)
        if usage is not None:
            r.set_usage(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_prompt_tokens,
                cache_write_prompt_tokens=usage.cache_write_prompt_tokens,
                cache_write_1h_prompt_tokens=usage.cache_write_1h_prompt_tokens,
                reasoning_tokens=usage.reasoning_tokens,
            )
        await self.client.settle(r)

    async def async_log_failure_event(self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any) -> None:
        # An attempt failed; a retry of the same call may still succeed.
        token = self._token(kwargs)
        found = self._open.get(token)
        if found is not None:
            self._settle_later(token, found[0], REFUND_AFTER_S)

    async def async_post_call_failure_hook(
        self, request_data: dict[str, Any], original_exception: Exception, user_api_key_dict: Any, traceback_str: str | None = None
    ) -> None:
        # The call failed for good (after LiteLLM's retries): refund now, or
        # commit what a stream had delivered before it broke.
        r = self._take(request_data)
        if r is not None:
            await self.client.settle(r, failed=True)


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _chunk_text(chunk: Any) -> str:
    """The completion text a streamed chunk carries: a chat or text
    completion chunk, a Responses API text delta, or an Anthropic
    ``content_block_delta`` (as objects, or as raw server-sent events)."""
    if isinstance(chunk, bytes):
        chunk = chunk.decode("utf-8", errors="replace")
    if isinstance(chunk, str):
        out = []
        for line in chunk.splitlines():
            if line.startswith("data:"):
                try:
                    out.append(_chunk_text(json.loads(line[5:].strip())))
                except ValueError:
                    continue
        return "".join(out)
    kind = _get(chunk, "type")
    if kind == "response.output_text.delta":
        return str(_get(chunk, "delta") or "")
    if kind == "content_block_delta":
        return str(_get(_get(chunk, "delta"), "text") or "")
    out = []
    for choice in _get(chunk, "choices") or []:
        delta = _get(choice, "delta")
        text = _get(delta, "content") if delta is not None else _get(choice, "text")
        if isinstance(text, str):
            out.append(text)
    return "".join(out)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def _billed(prompt: int, completion: int, cached: int, usage: Any, write: int) -> Usage:
    """The usage with its priced parts: cache writes (``write`` of them,
    split by TTL where the usage says, else all for 5 minutes) and reasoning
    tokens; parts held within their whole, so a Commit never refuses them."""
    # LiteLLM keeps the split in prompt_tokens_details; Anthropic's own shape
    # in cache_creation.
    ttl = (
        _get(_get(usage, "prompt_tokens_details"), "cache_creation_token_details")
        or _get(usage, "cache_creation_token_details")
        or _get(usage, "cache_creation")
    )
    five, hour = (_int(_get(ttl, "ephemeral_5m_input_tokens")), _int(_get(ttl, "ephemeral_1h_input_tokens"))) if ttl else (0, 0)
    if not (five or hour):
        five = write
    cached = min(cached, prompt)
    five = min(five, prompt - cached)
    hour = min(hour, prompt - cached - five)
    details = _get(usage, "completion_tokens_details") or _get(usage, "output_tokens_details")
    reasoning = min(_int(_get(details, "reasoning_tokens")) if details else 0, completion)
    return Usage(prompt, completion, cached, five, hour, reasoning)


def _usage_of(usage: Any) -> Usage | None:
    """The tokens of a usage in OpenAI's chat shape (as LiteLLM reports
    every provider's, cache writes in ``prompt_tokens_details.cache_write_tokens``
    or ``cache_creation_input_tokens``), the Responses API's, or Anthropic's
    (whose input_tokens leave out the cache reads and writes)."""
    prompt, completion = _get(usage, "prompt_tokens"), _get(usage, "completion_tokens")
    cache_read = _int(_get(usage, "cache_read_input_tokens"))
    cache_write = _int(_get(usage, "cache_creation_input_tokens"))
    if prompt is not None or completion is not None:
        details = _get(usage, "prompt_tokens_details")
        cached = (_int(_get(details, "cached_tokens")) if details else 0) or cache_read
        written = (_int(_get(details, "cache_write_tokens")) if details else 0) or cache_write
        return _billed(_int(prompt), _int(completion), cached, usage, written)
    inputs, outputs = _get(usage, "input_tokens"), _get(usage, "output_tokens")
    if inputs is None and outputs is None:
        return None
    if cache_read or cache_write:
        return _billed(_int(inputs) + cache_read + cache_write, _int(outputs), cache_read, usage, cache_write)
    details = _get(usage, "input_tokens_details")
    cached = _int(_get(details, "cached_tokens")) if details else 0
    return _billed(_int(inputs), _int(outputs), cached, usage, 0)


def _usage(kwargs: dict[str, Any], response_obj: Any) -> Usage | None:
    """The tokens of a finished call: the response's usage, or for a
    stream the one LiteLLM assembled."""
    for source in (kwargs.get("async_complete_streaming_response"), kwargs.get("complete_streaming_response"), response_obj):
        usage = _get(source, "usage") if source is not None else None
        if usage:
            found = _usage_of(usage)
            if found is not None and (found.prompt_tokens or found.completion_tokens):
                return found
    slo = kwargs.get("standard_logging_object") or {}
    if slo.get("total_tokens"):
        return Usage(int(slo.get("prompt_tokens", 0)), int(slo.get("completion_tokens", 0)))
    return None


#: The instance ``callbacks: ctxbudget.litellm.handler`` names.
handler = CtxBudgetHook()


@contextlib.contextmanager
def _callers_trace(data: Mapping[str, Any]) -> Iterator[None]:
    """The trace the proxy's caller sent (its ``traceparent`` header, which
    LiteLLM keeps in ``proxy_server_request``), current while the hook
    reserves, so that ctxbudget's decision joins it. A span already current
    (LiteLLM's own OpenTelemetry integration) is kept; nothing happens
    without ``opentelemetry-api``."""
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:  # pragma: no cover - opentelemetry-api is optional
        yield
        return
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, Mapping) else None
    if trace.get_current_span().get_span_context().is_valid or not isinstance(headers, Mapping):
        yield
        return
    carrier = {str(k).lower(): str(v) for k, v in headers.items() if str(k).lower() in ("traceparent", "tracestate")}
    if "traceparent" not in carrier:
        yield
        return
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)
