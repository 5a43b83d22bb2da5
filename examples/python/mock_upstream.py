"""A small upstream for trying and testing gateways, in three dialects:
OpenAI's ``POST /v1/chat/completions``, OpenAI's Responses API
``POST /v1/responses``, and Anthropic's ``POST /v1/messages``. Each answers a
fixed reply with its usage, streams it as server-sent events when ``stream``
is true (chat completions: a final usage chunk when
``stream_options.include_usage`` is), and counts what it served.

    python examples/python/mock_upstream.py 8001

- Usage: prompt tokens = characters of the messages (and the system prompt
  or instructions) ÷ 4, at least 1; completion tokens = min(output cap, 20),
  where the cap is ``max_tokens`` / ``max_completion_tokens`` /
  ``max_output_tokens``; ``cached_tokens`` = half the prompt when the
  request's ``user`` is "cached".
- ``metadata.mock_delay_ms`` in the body (or the ``x-mock-delay-ms`` header,
  or ``MOCK_DELAY_MS`` in the environment) holds each answer that long, so
  calls in flight can be observed; ``metadata.mock_status`` (or
  ``x-mock-status``) answers that HTTP status instead (an upstream failure).
  The body travels through a gateway unchanged; headers may not.
- Streams (chat completions): ``mock_no_usage`` / ``x-mock-no-usage`` sends
  no usage chunk even when asked (an upstream that reports none);
  ``mock_first_delay_ms`` / ``x-mock-first-delay-ms`` waits that long before
  the first chunk; ``mock_break_after`` / ``x-mock-break-after`` drops the
  connection after that many chunks (a stream cut short).
- ``GET /stats``: requests served, in flight now, the most ever in flight,
  tokens; ``GET /received``: the last 100 request bodies with their paths;
  ``POST /reset`` zeroes both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

app = FastAPI()
STATS = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "prompt_tokens": 0, "completion_tokens": 0}
RECEIVED: list[dict[str, Any]] = []
WORDS = ["All", " right", ",", " here", " is", " a", " reply", " from", " the", " mock", "."]


class CutShort(Exception):
    """Raised to drop a stream's connection on purpose (``mock_break_after``)."""


class _QuietCuts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CutShort))


logging.getLogger("uvicorn.error").addFilter(_QuietCuts())


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


class Call:
    """One request: its options, the usage it bills, and its reply text."""

    def __init__(self, request: Request, body: dict[str, Any], prompt_chars: int, cap: Any):
        meta = body.get("metadata") or {}

        def option(name: str, default: str = "") -> str:
            return str(meta.get(f"mock_{name}") or request.headers.get(f"x-mock-{name.replace('_', '-')}", default))

        self.status = int(option("status", "200"))
        self.delay = int(option("delay_ms", os.environ.get("MOCK_DELAY_MS", "0"))) / 1000
        self.first_delay = int(option("first_delay_ms", "0")) / 1000
        self.break_after = int(option("break_after", "0"))
        self.no_usage = bool(option("no_usage"))
        self.prompt = max(1, prompt_chars // 4)
        self.completion = min(int(cap or 20), 20)
        self.cached = self.prompt // 2 if body.get("user") == "cached" else 0
        self.text = "".join(WORDS)[: self.completion * 4]
        self.model = body.get("model", "mock")
        self.created = int(time.time())
        RECEIVED.append({"path": request.url.path, "body": body})
        del RECEIVED[:-100]
        STATS["requests"] += 1
        STATS["in_flight"] += 1
        STATS["max_in_flight"] = max(STATS["max_in_flight"], STATS["in_flight"])

    async def answered(self) -> None:
        """Waits the answer's delay; the call is no longer in flight."""
        try:
            await asyncio.sleep(self.delay)
        finally:
            STATS["in_flight"] -= 1

    def billed(self) -> None:
        STATS["prompt_tokens"] += self.prompt
        STATS["completion_tokens"] += self.completion

    def failure(self) -> JSONResponse:
        return JSONResponse({"error": {"message": "mock upstream failure", "type": "server_error"}}, status_code=self.status)


@app.get("/stats")
async def stats() -> dict[str, int]:
    return STATS


@app.get("/received")
async def received() -> list[dict[str, Any]]:
    return RECEIVED


@app.post("/reset")
async def reset() -> dict[str, int]:
    for k in STATS:
        STATS[k] = 0
    RECEIVED.clear()
    return STATS


@app.post("/v1/chat/completions")
async def chat(request: Request) -> Any:
    body = await request.json()
    chars = sum(len(_text(m.get("content"))) for m in body.get("messages", []))
    call = Call(request, body, chars, body.get("max_completion_tokens") or body.get("max_tokens"))
    usage = {
        "prompt_tokens": call.prompt,
        "completion_tokens": call.completion,
        "total_tokens": call.prompt + call.completion,
        "prompt_tokens_details": {"cached_tokens": call.cached},
    }
    rid = f"chatcmpl-mock{STATS['requests']}"
    if call.status >= 400:
        await call.answered()
        return call.failure()
    if not body.get("stream"):
        await call.answered()
        call.billed()
        return {
            "id": rid, "object": "chat.completion", "created": call.created, "model": call.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": call.text}, "finish_reason": "stop"}],
            "usage": usage,
        }

    include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not call.no_usage

    async def events() -> Any:
        try:
            await asyncio.sleep(call.first_delay)
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": call.created, "model": call.model}
            pieces = [call.text[i : i + 8] for i in range(0, len(call.text), 8)] or [""]
            for i, piece in enumerate(pieces):
                if call.break_after and i == call.break_after:
                    call.billed()  # the provider bills what it generated
                    raise CutShort
                delta = {"content": piece} if i else {"role": "assistant", "content": piece}
                yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
                await asyncio.sleep(call.delay / len(pieces))
            yield f"data: {json.dumps({**chunk, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
            if include_usage:
                yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
            call.billed()
        finally:
            STATS["in_flight"] -= 1

    return StreamingResponse(events(), media_type="text/event-stream")


@app.post("/v1/responses")
async def responses(request: Request) -> Any:
    body = await request.json()
    items = body.get("input")
    if isinstance(items, str):
        chars = len(items)
    else:
        chars = sum(len(_text(i.get("content"))) for i in items or [] if isinstance(i, dict))
    chars += len(body.get("instructions") or "")
    call = Call(request, body, chars, body.get("max_output_tokens"))
    await call.answered()
    if call.status >= 400:
        return call.failure()
    call.billed()
    n = STATS["requests"]
    return {
        "id": f"resp_mock{n}", "object": "response", "created_at": call.created, "status": "completed",
        "model": call.model, "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "parallel_tool_calls": True, "temperature": 1.0,
        "tool_choice": "auto", "tools": [], "top_p": 1.0, "metadata": {},
        "output": [{
            "type": "message", "id": f"msg_mock{n}", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": call.text, "annotations": []}],
        }],
        "usage": {
            "input_tokens": call.prompt, "input_tokens_details": {"cached_tokens": call.cached},
            "output_tokens": call.completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": call.prompt + call.completion,
        },
    }


@app.post("/v1/messages")
async def messages(request: Request) -> Any:
    body = await request.json()
    chars = sum(len(_text(m.get("content"))) for m in body.get("messages", []))
    chars += len(_text(body.get("system")))
    call = Call(request, body, chars, body.get("max_tokens"))
    await call.answered()
    if call.status >= 400:
        return JSONResponse({"type": "error", "error": {"type": "api_error", "message": "mock upstream failure"}},
                            status_code=call.status)
    call.billed()
    return {
        "id": f"msg_mock{STATS['requests']}", "type": "message", "role": "assistant", "model": call.model,
        "content": [{"type": "text", "text": call.text}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {
            # Anthropic's input_tokens leave out the cache reads.
            "input_tokens": call.prompt - call.cached, "output_tokens": call.completion,
            "cache_read_input_tokens": call.cached, "cache_creation_input_tokens": 0,
        },
    }


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]) if len(sys.argv) > 1 else 8001, log_level="warning")
