"""An example gateway: OpenAI-compatible ``POST /v1/chat/completions``
(streaming and not) in front of any OpenAI-compatible upstream, with every
call budgeted by ctxbudget through its Python client.

    CTXBUDGET_TARGET=127.0.0.1:50051 UPSTREAM_URL=http://127.0.0.1:8001/v1 \\
      GATEWAY_KEYS=examples/python/keys.json uvicorn gateway:app --app-dir examples/python --port 8000

- The caller's API key (``Authorization: Bearer sk-…``) names its tenant,
  user and tier in ``GATEWAY_KEYS`` (a JSON file: key → {tenant, user, tier}).
- Each call reserves first; a denial answers 429 (or 413, or 403 for a
  blocked tenant) with ``Retry-After`` and ``x-ratelimit-*``, in OpenAI's
  error shape, without calling upstream. Other ctxbudget errors answer as
  ``ctxbudget.errors`` maps them: 400 for the caller's (an unknown tier, a
  malformed id), 503 when ctxbudget does not answer, 500 for the rest.
- The upstream gets ``max_tokens`` = what ctxbudget granted, and for a
  stream ``stream_options.include_usage`` (the usage chunk reaches the caller
  only if it asked for it). Upstream calls are retried with the client's
  retry helper (429/5xx/connection errors, Retry-After, one idempotency key).
- A model with fallbacks (``GATEWAY_FALLBACKS``: a JSON file, model → models
  to fall back to, as LiteLLM's ``fallbacks``) reserves on the first of them
  with room, in one CheckAndReserve (``candidate_models``), and the call goes
  to that model: no 429 while a fallback has room.
- The usage commits when the answer (or the stream) ends. A stream that ends
  without usage — the caller gone mid-stream, an upstream that sends no usage
  chunk — commits the prompt as reserved and the completion counted by
  ctxbudget from the text that reached the caller (the provider bills it);
  a call that fails before any output reached the caller refunds. A long
  stream keeps its lease alive. ctxbudget unreachable: ``ON_UNAVAILABLE=deny``
  (503, default) or ``allow`` (forward unbudgeted, with the caller's own
  ``max_tokens`` if it gave one).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any, AsyncIterator

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ctxbudget import AsyncBudgetClient, BudgetError, RetryPolicy, retry_async

UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001/v1").rstrip("/")
UPSTREAM_KEY = os.environ.get("UPSTREAM_API_KEY", "")

log = logging.getLogger("gateway")
app = FastAPI(title="ctxbudget example gateway")
budget = AsyncBudgetClient(
    os.environ.get("CTXBUDGET_TARGET", "127.0.0.1:50051"),
    token=os.environ.get("CTXBUDGET_TOKEN") or None,
    on_unavailable=os.environ.get("ON_UNAVAILABLE", "deny"),  # type: ignore[arg-type]
)
http = httpx.AsyncClient(timeout=httpx.Timeout(600, connect=5))


def load_keys() -> dict[str, dict[str, str]]:
    with open(os.environ.get("GATEWAY_KEYS", os.path.join(os.path.dirname(__file__), "keys.json"))) as f:
        return json.load(f)


KEYS = load_keys()


def load_fallbacks() -> dict[str, list[str]]:
    """Model → the models to fall back to, in order, from the JSON file
    ``GATEWAY_FALLBACKS`` names (none by default): an object
    ``{"model": ["fallback", …]}``, or LiteLLM's ``fallbacks`` list of such
    objects. Each list loses the model itself and repeats, and is cut to the
    7 ctxbudget takes beside it."""
    path = os.environ.get("GATEWAY_FALLBACKS")
    if not path:
        return {}
    with open(path) as f:
        loaded = json.load(f)
    entries = loaded if isinstance(loaded, list) else [loaded]
    out: dict[str, list[str]] = {}
    for entry in entries:
        for model, fallbacks in entry.items():
            kept = out.setdefault(model, [])
            for m in fallbacks:
                if m != model and m not in kept and len(kept) < 7:
                    kept.append(m)
    return out


#: A call for a model with fallbacks reserves on the first of them with room
#: (one CheckAndReserve with ``candidate_models``) and goes to that model.
FALLBACKS = load_fallbacks()


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": kind}}, status_code=status, headers=headers)


#: OpenAI's error type for each status a ctxbudget error answers.
ERROR_TYPES = {
    400: "invalid_request_error", 403: "blocked", 413: "request_too_large", 429: "rate_limit_exceeded",
    503: "service_unavailable",
}


def budget_error(e: BudgetError) -> JSONResponse:
    """A denial or a ctxbudget error, as the caller's answer."""
    message = getattr(getattr(e, "response", None), "detail", "") or str(e)
    return error(e.http_status, message, ERROR_TYPES.get(e.http_status, "internal_error"), e.headers)


def text_of(chunk: dict[str, Any]) -> str:
    """The completion text of a streamed chunk."""
    return "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])


async def settle(r: Any, *, failed: bool = False) -> None:
    """Settles a reservation once the caller has (or will have) its answer:
    a failed Commit is logged, not turned into an error for an answer the
    upstream already produced (the lease lapses in its own time)."""
    try:
        await budget.settle(r, failed=failed)
    except BudgetError as e:
        log.warning("settling %s failed: %s", r.reservation_id, e)


def usage_of(u: dict[str, Any]) -> dict[str, int]:
    """An OpenAI usage as ``set_usage`` takes it: the prompt with its cache
    reads and writes, the completion with its reasoning tokens (each priced
    at the model group's price for it)."""
    details = u.get("prompt_tokens_details") or {}
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    cached = min(int(details.get("cached_tokens") or 0), prompt)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_prompt_tokens": cached,
        "cache_write_prompt_tokens": min(int(details.get("cache_write_tokens") or 0), prompt - cached),
        "reasoning_tokens": min(int(reasoning), completion),
    }


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    who = KEYS.get(key)
    if who is None:
        return error(401, "unknown API key", "invalid_api_key")
    body = await request.json()
    asked = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    model = body.get("model", "")
    candidates = [model, *FALLBACKS.get(model, [])]
    try:
        r = await budget.reserve(
            tenant=who["tenant"], user=who.get("user", ""), tier=who["tier"], model=model,
            messages=body.get("messages", []), max_output_tokens=int(asked),
            candidate_models=candidates if len(candidates) > 1 else (),
        )
    except BudgetError as e:
        return budget_error(e)

    upstream_body = dict(body)
    if r.response is not None and r.response.chosen_model:
        upstream_body["model"] = r.response.chosen_model  # the candidate with room
    granted = r.granted_max_output_tokens
    if granted is not None:  # None: let through unbudgeted with no cap asked
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        upstream_body[field] = granted
    headers = {"Authorization": f"Bearer {UPSTREAM_KEY}"} if UPSTREAM_KEY else {}
    stream = bool(body.get("stream"))
    wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    if stream:
        upstream_body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}

    async def send(idempotency_key: str) -> httpx.Response:
        req = http.build_request("POST", f"{UPSTREAM}/chat/completions", json=upstream_body,
                                 headers={**headers, "Idempotency-Key": idempotency_key})
        return await http.send(req, stream=stream)

    try:
        resp = await retry_async(send, policy=RetryPolicy(max_attempts=3), idempotency_key=str(uuid.uuid4()))
    except Exception as e:  # connection errors, attempts exhausted
        await settle(r, failed=True)
        return error(502, f"upstream unreachable: {e}", "upstream_error")
    if resp.status_code >= 400:
        content = await resp.aread() if stream else resp.content
        await resp.aclose()
        await settle(r, failed=True)
        return Response(content, status_code=resp.status_code, media_type="application/json", headers=r.headers)

    if not stream:
        data = resp.json()
        r.set_usage(**usage_of(data.get("usage") or {}))
        await settle(r)
        return JSONResponse(data, headers=r.headers)

    renewer = budget.keep_alive(r)

    async def relay() -> AsyncIterator[bytes]:
        finished = False
        try:
            async for line in resp.aiter_lines():
                text = None
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        r.set_usage(**usage_of(chunk["usage"]))
                        if not chunk.get("choices") and not wants_usage:
                            continue
                    text = text_of(chunk)
                if line.strip():
                    yield (line + "\n\n").encode()
                    if text is not None:
                        # It reached the caller: from here on the call is
                        # billed, even if the stream breaks.
                        r.record_output(text)
            finished = True
        finally:
            # A caller who went away mid-stream lands here too, inside a
            # cancelled scope (Starlette cancels the response's task): shield
            # the clean-up, or every await in it would be cancelled as well.
            # Without usage, what reached the caller is committed (counted by
            # ctxbudget); with nothing delivered, the reservation is refunded.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
                await budget.stop_keep_alive(renewer)
                await settle(r, failed=not finished)

    return StreamingResponse(relay(), media_type="text/event-stream", headers=r.headers)
