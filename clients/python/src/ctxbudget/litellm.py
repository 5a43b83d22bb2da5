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

Before each chat or text completion the hook reserves with ctxbudget and
sends ``max_tokens`` = what was granted; a denial refuses the call with HTTP
429 (or 413) and ``Retry-After`` / ``x-ratelimit-*`` headers. After a success
it commits the real usage (for a stream, the usage LiteLLM assembled from its
final chunk); after a failure it refunds.

When LiteLLM's own retries are on, a failed attempt is logged as a failure
and a later attempt of the same call may still succeed: so a logged failure
only stops renewing the lease and schedules a refund ``REFUND_AFTER_S``
later, which a success (commit) or the proxy's final failure hook (refund at
once) overtakes. Reservations are found by LiteLLM's call id, never by
anything the caller sent: a caller's own ``metadata`` key of the hook's name
is dropped.

Settings (environment):

- ``CTXBUDGET_TARGET`` (``127.0.0.1:50051``), ``CTXBUDGET_TOKEN`` (bearer),
  ``CTXBUDGET_TIMEOUT`` (seconds, 2), ``CTXBUDGET_ON_UNAVAILABLE``
  (``deny``: 503, or ``allow``: let calls through unbudgeted).
- ``CTXBUDGET_TENANT_FROM``, ``CTXBUDGET_USER_FROM``, ``CTXBUDGET_TIER_FROM``:
  which field of the caller's key names each, from LiteLLM's
  ``UserAPIKeyAuth``: an attribute (``team_id``, ``user_id``, ``key_alias``,
  ``token``…) or ``metadata.<name>`` / ``team_metadata.<name>``; or
  ``request.<name>`` for the request's own ``metadata`` (or ``user`` for the
  request's ``user`` field). Defaults: tenant ``team_id`` (else the key's
  hash), user ``user_id``, tier ``metadata.tier``.
- ``CTXBUDGET_DEFAULT_TIER``: the tier when none is named (``default``).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from fastapi import HTTPException

from .aio import AsyncBudgetClient
from .errors import BudgetDenied, BudgetUnavailable

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as e:  # pragma: no cover - the hook is for the proxy only
    raise ImportError("ctxbudget.litellm needs LiteLLM: pip install 'litellm[proxy]'") from e

# The calls that carry a prompt and produce tokens.
BUDGETED_CALLS = {"completion", "acompletion", "text_completion", "atext_completion", "responses", "aresponses"}
_KEY = "ctxbudget_reservation_id"
# The hook's own handle on a call, in the call's metadata: LiteLLM's call id
# can be set by the caller (x-litellm-call-id), so it is not trusted.
_TOKEN = "ctxbudget_hook_token"
#: How long after a logged failure the reservation is refunded unless the
#: call's retry succeeds first (seconds).
REFUND_AFTER_S = 30.0


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


class CtxBudgetHook(CustomLogger):
    """The LiteLLM proxy hook (``callbacks: ctxbudget.litellm.handler``)."""

    def __init__(self, client: AsyncBudgetClient | None = None, **settings: str):
        super().__init__()
        self._client = client
        self._settings = settings
        # Reservations in flight in this process, by LiteLLM's call id.
        self._open: dict[str, Any] = {}

    def _setting(self, name: str, default: str) -> str:
        return self._settings.get(name) or os.environ.get(f"CTXBUDGET_{name.upper()}") or default

    @property
    def client(self) -> AsyncBudgetClient:
        # Made on first use: LiteLLM sets the configuration's
        # environment_variables after importing the callback.
        if self._client is None:
            self._client = AsyncBudgetClient(
                self._setting("target", "127.0.0.1:50051"),
                token=self._setting("token", "") or None,
                timeout=float(self._setting("timeout", "2")),
                on_unavailable=self._setting("on_unavailable", "deny"),  # type: ignore[arg-type]
            )
        return self._client

    def _who(self, key: Any, data: dict[str, Any]) -> tuple[str, str, str]:
        tenant = _lookup(self._setting("tenant_from", "team_id"), key, data)
        if not tenant:
            tenant = str(getattr(key, "token", "") or getattr(key, "api_key", "") or "anonymous")
        user = _lookup(self._setting("user_from", "user_id"), key, data)
        tier = _lookup(self._setting("tier_from", "metadata.tier"), key, data) or self._setting("default_tier", "default")
        return tenant, user, tier

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict:
        # The caller's request metadata merges into data["metadata"]: never
        # trust a reservation id found there.
        if isinstance(data.get("metadata"), dict):
            data["metadata"].pop(_KEY, None)
            data["metadata"].pop(_TOKEN, None)
        if str(call_type) not in BUDGETED_CALLS:
            return data
        tenant, user, tier = self._who(user_api_key_dict, data)
        asked = data.get("max_completion_tokens") or data.get("max_tokens") or 0
        prompt: dict[str, Any]
        if data.get("messages") is not None:
            prompt = {"messages": data["messages"]}
        else:
            text = data.get("prompt") or data.get("input") or ""
            prompt = {"prompt": text if isinstance(text, str) else " ".join(map(str, text))}
        try:
            r = await self.client.reserve(
                tenant=tenant, user=user, tier=tier, model=str(data.get("model") or ""),
                max_output_tokens=int(asked), **prompt,
            )
        except BudgetDenied as d:
            raise HTTPException(status_code=d.http_status, detail=d.response.detail or d.reason, headers=d.headers) from d
        except BudgetUnavailable as u:
            raise HTTPException(status_code=503, detail=str(u), headers=u.headers) from u
        if r.reservation_id is None:
            return data  # ctxbudget unreachable, on_unavailable = allow
        field = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
        data[field] = r.granted_max_output_tokens
        token = uuid.uuid4().hex
        meta = data.setdefault("metadata", {})
        meta[_KEY], meta[_TOKEN] = r.reservation_id, token
        self._open[token] = (r, self.client.keep_alive(r))
        return data

    @staticmethod
    def _token(call: dict[str, Any]) -> str:
        """The hook's token of a call, from the metadata it wrote (in the
        request data, or in a logging event's litellm_params)."""
        for meta in ((call.get("litellm_params") or {}).get("metadata"), call.get("metadata")):
            if isinstance(meta, dict) and meta.get(_TOKEN):
                return str(meta[_TOKEN])
        return ""

    def _take(self, call: dict[str, Any]) -> Any:
        """The reservation of a finished call (the same token for every
        attempt), if this process holds it."""
        found = self._open.pop(self._token(call), None)
        if found is not None:
            r, task = found
            if task is not None:
                task.cancel()
        return found

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        found = self._take(kwargs)
        if found is None:
            return
        r, _ = found
        usage = _usage(kwargs, response_obj)
        if usage is not None:
            r.set_usage(*usage)
        await self.client.settle(r)

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        # An attempt failed; a retry of the same call may still succeed.
        call_id = self._token(kwargs)
        found = self._open.get(call_id)
        if found is None:
            return
        r, task = found
        if task is not None:
            task.cancel()

        async def refund_later() -> None:
            await asyncio.sleep(REFUND_AFTER_S)
            if self._open.get(call_id, (None,))[0] is r:
                del self._open[call_id]
                await self.client.settle(r, failed=True)

        self._open[call_id] = (r, asyncio.get_running_loop().create_task(refund_later()))

    async def async_post_call_failure_hook(self, request_data: dict, original_exception: Exception, user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        # The call failed for good (after LiteLLM's retries): refund now.
        found = self._take(request_data)
        if found is not None:
            await self.client.settle(found[0], failed=True)


def _usage(kwargs: dict[str, Any], response_obj: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt) tokens of a finished call: the
    response's usage, or for a stream the one LiteLLM assembled."""
    for source in (kwargs.get("async_complete_streaming_response"), kwargs.get("complete_streaming_response"), response_obj):
        usage = getattr(source, "usage", None) if source is not None else None
        if usage is None and isinstance(source, dict):
            usage = source.get("usage")
        if usage:
            get = (lambda k: usage.get(k)) if isinstance(usage, dict) else (lambda k: getattr(usage, k, None))
            details = get("prompt_tokens_details")
            cached = (details.get("cached_tokens") if isinstance(details, dict) else getattr(details, "cached_tokens", 0)) if details else 0
            prompt = get("prompt_tokens") or get("input_tokens") or 0
            completion = get("completion_tokens") or get("output_tokens") or 0
            return int(prompt), int(completion), int(cached or 0)
    slo = kwargs.get("standard_logging_object") or {}
    if slo.get("total_tokens"):
        return int(slo.get("prompt_tokens", 0)), int(slo.get("completion_tokens", 0)), 0
    return None


#: The instance ``callbacks: ctxbudget.litellm.handler`` names.
handler = CtxBudgetHook()
