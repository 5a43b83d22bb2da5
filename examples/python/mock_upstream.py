"""A small OpenAI-compatible upstream for trying and testing gateways:
``POST /v1/chat/completions`` answers a fixed reply with ``usage``, streams
it as server-sent events when ``stream`` is true (a final usage chunk when
``stream_options.include_usage`` is), and counts what it served.

    python examples/python/mock_upstream.py 8001

- Usage: prompt tokens = characters of the messages ÷ 4 (at least 1);
  completion tokens = min(max_tokens, 20) (``max_completion_tokens`` too);
  ``cached_tokens`` = half the prompt when the request's ``user`` is "cached".
- ``metadata.mock_delay_ms`` in the body (or the ``x-mock-delay-ms`` header,
  or ``MOCK_DELAY_MS`` in the environment) holds each answer that long, so
  calls in flight can be observed; ``metadata.mock_status`` (or
  ``x-mock-status``) answers that HTTP status instead (an upstream failure).
  The body travels through a gateway unchanged; headers may not.
- ``GET /stats``: requests served, in flight now, the most ever in flight,
  tokens; ``POST /reset`` zeroes them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

app = FastAPI()
STATS = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "prompt_tokens": 0, "completion_tokens": 0}
WORDS = ["All", " right", ",", " here", " is", " a", " reply", " from", " the", " mock", "."]


def _text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


@app.get("/stats")
async def stats():
    return STATS


@app.post("/reset")
async def reset():
    for k in STATS:
        STATS[k] = 0
    return STATS


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.json()
    meta = body.get("metadata") or {}
    status = int(meta.get("mock_status") or request.headers.get("x-mock-status", "200"))
    delay = int(meta.get("mock_delay_ms") or request.headers.get("x-mock-delay-ms", os.environ.get("MOCK_DELAY_MS", "0"))) / 1000
    STATS["requests"] += 1
    STATS["in_flight"] += 1
    STATS["max_in_flight"] = max(STATS["max_in_flight"], STATS["in_flight"])
    prompt = max(1, sum(len(_text(m.get("content"))) for m in body.get("messages", [])) // 4)
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 20
    completion = min(int(limit), 20)
    cached = prompt // 2 if body.get("user") == "cached" else 0
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    created, model, rid = int(time.time()), body.get("model", "mock"), f"chatcmpl-mock{STATS['requests']}"
    text = "".join(WORDS)[: completion * 4]

    if status >= 400:
        await asyncio.sleep(delay)
        STATS["in_flight"] -= 1
        return JSONResponse({"error": {"message": "mock upstream failure", "type": "server_error"}}, status_code=status)

    if not body.get("stream"):
        try:
            await asyncio.sleep(delay)
        finally:
            STATS["in_flight"] -= 1
        STATS["prompt_tokens"] += prompt
        STATS["completion_tokens"] += completion
        return {
            "id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage,
        }

    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events():
        try:
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            pieces = [text[i : i + 8] for i in range(0, len(text), 8)] or [""]
            for i, piece in enumerate(pieces):
                delta = {"content": piece} if i else {"role": "assistant", "content": piece}
                yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
                await asyncio.sleep(delay / len(pieces))
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
            if include_usage:
                yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            STATS["prompt_tokens"] += prompt
            STATS["completion_tokens"] += completion
        finally:
            STATS["in_flight"] -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8001, log_level="warning")
