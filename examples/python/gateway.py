"""An example gateway: OpenAI-compatible ``POST /v1/chat/completions``
(streaming and not) in front of any OpenAI-compatible upstream, with every
call budgeted by ctxbudget through its Python client.

    CTXBUDGET_TARGET=127.0.0.1:50051 UPSTREAM_URL=http://127.0.0.1:8001/v1 \\
      GATEWAY_KEYS=examples/python/keys.json uvicorn gateway:app --app-dir examples/python --port 8000

- The caller's API key (``Authorization: Bearer sk-…``) names its tenant,
  user and tier in ``GATEWAY_KEYS`` (a JSON file: key → {tenant, user, tier}).
- Each call reserves first; a denial answers 429 (or 413) with ``Retry-After``
  and ``x-ratelimit-*``, in OpenAI's error shape, without calling upstream.
- The upstream gets ``max_tokens`` = what ctxbudget granted, and for a
  stream ``stream_options.include_usage`` (the usage chunk reaches the caller
  only if it asked for it). Upstream calls are retried with the client's
  retry helper (429/5xx/connection errors, Retry-After, one idempotency key).
- The usage commits when the answer (or the stream) ends; an upstream error,
  or a caller who disconnects mid-stream, refunds. A long stream keeps its
  lease alive. ctxbudget unreachable: ``ON_UNAVAILABLE=deny`` (503, default)
  or ``allow`` (forward unbudgeted).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, AsyncIterator

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ctxbudget import AsyncBudgetClient, BudgetDenied, BudgetUnavailable, RetryPolicy, retry_async

UPSTREAM = os.environ.get("UPSTREAM_URL", "http://127.0.0.1:8001/v1").rstrip("/")
UPSTREAM_KEY = os.environ.get("UPSTREAM_API_KEY", "")

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


def error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": kind}}, status_code=status, headers=headers)


def usage_of(u: dict[str, Any]) -> tuple[int, int, int]:
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)), int(cached)


@app.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    who = KEYS.get(key)
    if who is None:
        return error(401, "unknown API key", "invalid_api_key")
    body = await request.json()
    asked = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    try:
        r = await budget.reserve(
            tenant=who["tenant"], user=who.get("user", ""), tier=who["tier"], model=body.get("model", ""),
            messages=body.get("messages", []), max_output_tokens=int(asked),
        )
    except BudgetDenied as d:
        kind = "rate_limit_exceeded" if d.http_status == 429 else "request_too_large"
        return error(d.http_status, d.response.detail, kind, d.headers)
    except BudgetUnavailable as u:
        return error(503, str(u), "service_unavailable", u.headers)

    upstream_body = dict(body)
    if r.reservation_id is not None:
        field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        upstream_body[field] = r.granted_max_output_tokens
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
        await budget.settle(r, failed=True)
        return error(502, f"upstream unreachable: {e}", "upstream_error")
    if resp.status_code >= 400:
        content = await resp.aread() if stream else resp.content
        await resp.aclose()
        await budget.settle(r, failed=True)
        return Response(content, status_code=resp.status_code, media_type="application/json", headers=r.headers)

    if not stream:
        data = resp.json()
        r.set_usage(*usage_of(data.get("usage") or {}))
        await budget.settle(r)
        return JSONResponse(data, headers=r.headers)

    renewer = budget.keep_alive(r)

    async def relay() -> AsyncIterator[bytes]:
        finished = False
        try:
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        r.set_usage(*usage_of(chunk["usage"]))
                        if not chunk.get("choices") and not wants_usage:
                            continue
                if line.strip():
                    yield (line + "\n\n").encode()
            finished = True
        finally:
            # A caller who went away mid-stream lands here too, inside a
            # cancelled scope (Starlette cancels the response's task): shield
            # the clean-up, or every await in it would be cancelled as well.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
                await budget.stop_keep_alive(renewer)
                await budget.settle(r, failed=not finished)

    return StreamingResponse(relay(), media_type="text/event-stream", headers=r.headers)
