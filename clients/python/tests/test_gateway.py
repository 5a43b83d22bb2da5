"""The example gateway (examples/python/gateway.py), driven by the official
``openai`` SDK, in front of the mock upstream, budgeted by a real ctxbudget:
answers and streams pass through with usage committed, a 429 carries the
headers, an upstream failure and a caller gone mid-stream refund."""

from __future__ import annotations

import json
import os
import time

import httpx
import openai
import pytest

from conftest import REPO, Service, Uvicorn
from ctxbudget import BudgetClient, pb

CONFIG = """
[reservations]
retry_jitter_ms = 0

[tiers.free]
max_context_tokens = 8000
default_max_output_tokens = 50
user = { requests = [{ limit = 6, period = "1d" }], tokens = [{ limit = 100000, period = "1d" }], concurrency = 2 }
"""
EXAMPLES = str(REPO / "examples" / "python")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("gw") / "keys.json"
    keys.write_text(json.dumps({
        "sk-alice": {"tenant": "acme", "user": "alice", "tier": "free"},
        "sk-carol": {"tenant": "acme", "user": "carol", "tier": "free"},
        "sk-dave": {"tenant": "acme", "user": "dave", "tier": "free"},
    }))
    service = Service(CONFIG)
    upstream = Uvicorn("mock_upstream:app", EXAMPLES, {"MOCK_DELAY_MS": "0"})
    gateway = Uvicorn("gateway:app", EXAMPLES, {
        "CTXBUDGET_TARGET": service.target,
        "UPSTREAM_URL": upstream.url + "/v1",
        "GATEWAY_KEYS": str(keys),
    })
    yield service, upstream, gateway
    gateway.stop()
    upstream.stop()
    service.stop()


def sdk(gateway, key):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def user_left(service, user, dimension):
    with BudgetClient(service.target) as c:
        s = c.get_status("acme", "free", user=user)
        return next(l.remaining for l in s.limits if l.level == pb.LEVEL_USER and l.dimension == dimension)


MESSAGES = [{"role": "user", "content": "Say something short about budgets, please."}]


def test_answers_and_streams_pass_through_and_commit_their_usage(stack):
    service, upstream, gateway = stack
    client = sdk(gateway, "sk-alice")
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES, max_tokens=10)
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens == 10, "max_tokens = what ctxbudget granted"
    assert raw.headers["x-ratelimit-limit-requests"] == "6"
    used = reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert user_left(service, "alice", pb.DIMENSION_TOKENS) == 100000 - used, "committed the real usage"

    chunks = list(client.chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert all(c.usage is None for c in chunks), "no usage chunk unless asked for"
    streamed = httpx.get(upstream.url + "/stats").json()
    assert streamed["completion_tokens"] == 10 + 20
    assert user_left(service, "alice", pb.DIMENSION_TOKENS) == 100000 - used - (streamed["prompt_tokens"] - reply.usage.prompt_tokens) - 20
    with_usage = list(client.chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].usage.completion_tokens == 20


def test_a_denial_is_a_429_with_its_headers(stack):
    service, _, gateway = stack
    client = sdk(gateway, "sk-carol")
    for _ in range(6):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
    before = httpx.get(stack[1].url + "/stats").json()["requests"]
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=5)
    h = e.value.response.headers
    assert int(h["retry-after"]) > 1
    assert h["x-ratelimit-limit-requests"] == "6" and h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"].endswith("s")
    assert e.value.body["type"] == "rate_limit_exceeded"
    assert httpx.get(stack[1].url + "/stats").json()["requests"] == before, "never reached the upstream"
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway, "sk-nobody").chat.completions.create(model="gpt-4o", messages=MESSAGES)


def test_an_upstream_failure_and_a_caller_gone_mid_stream_refund(stack):
    service, upstream, gateway = stack
    client = sdk(gateway, "sk-dave")
    tokens = user_left(service, "dave", pb.DIMENSION_TOKENS)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, metadata={"mock_status": "400"})
    assert user_left(service, "dave", pb.DIMENSION_TOKENS) == tokens, "refunded"
    # A slow stream the caller abandons after its first chunk.
    with httpx.stream("POST", gateway.url + "/v1/chat/completions",
                      headers={"Authorization": "Bearer sk-dave"},
                      json={"model": "gpt-4o", "messages": MESSAGES, "stream": True,
                            "metadata": {"mock_delay_ms": "3000"}}) as s:
        # Hold the iterator: dropping it closes the response (a disconnect).
        lines = s.iter_lines()
        assert next(lines).startswith("data: ")
        assert user_left(service, "dave", pb.DIMENSION_CONCURRENCY) == 1, "one slot held while streaming"
        assert user_left(service, "dave", pb.DIMENSION_REQUESTS) == 5
    deadline = time.time() + 10
    while user_left(service, "dave", pb.DIMENSION_CONCURRENCY) != 2 and time.time() < deadline:
        time.sleep(0.05)
    assert user_left(service, "dave", pb.DIMENSION_CONCURRENCY) == 2, "the slot came back"
    assert user_left(service, "dave", pb.DIMENSION_TOKENS) == tokens, "refunded, not committed"
