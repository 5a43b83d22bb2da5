"""The example gateway (examples/python/gateway.py), driven by the official
``openai`` SDK, in front of the mock upstream, budgeted by a real ctxbudget:
answers and streams pass through with usage committed, a 429 carries the
headers, ctxbudget's errors map to 400 / 503, an upstream failure refunds,
and a stream cut short (or without usage) commits what reached the caller."""

from __future__ import annotations

import json
import os
import time

import httpx
import openai
import pytest

from conftest import REPO, Service, Uvicorn, free_port
from ctxbudget import BudgetClient, pb

CONFIG = """
[reservations]
retry_jitter_ms = 0

[models.tiny]
match = ["tiny-*"]
global = { requests = [{ limit = 1, period = "1h" }] }

[tiers.free]
max_context_tokens = 8000
default_max_output_tokens = 50
user = { requests = [{ limit = 6, period = "1d" }], tokens = [{ limit = 100000, period = "1d" }], concurrency = 2 }

[tiers.pro]
max_context_tokens = 100000
default_max_output_tokens = 50
tenant = { tokens = [{ limit = 1000000, window = "day" }] }
"""
EXAMPLES = str(REPO / "examples" / "python")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("gw") / "keys.json"
    keys.write_text(json.dumps({
        "sk-alice": {"tenant": "acme", "user": "alice", "tier": "free"},
        "sk-carol": {"tenant": "acme", "user": "carol", "tier": "free"},
        "sk-dave": {"tenant": "acme", "user": "dave", "tier": "free"},
        "sk-erin": {"tenant": "acme", "user": "erin", "tier": "no-such-tier"},
        "sk-frank": {"tenant": "bad\ttenant", "user": "frank", "tier": "free"},
        "sk-gina": {"tenant": "acme", "user": "gina", "tier": "free"},
    }))
    fallbacks = keys.parent / "fallbacks.json"
    fallbacks.write_text(json.dumps({"tiny-1": ["gpt-4o-mini"]}))
    service = Service(CONFIG)
    upstream = Uvicorn("mock_upstream:app", EXAMPLES, {"MOCK_DELAY_MS": "0"})
    env = {"CTXBUDGET_TARGET": service.target, "UPSTREAM_URL": upstream.url + "/v1", "GATEWAY_KEYS": str(keys),
           "GATEWAY_FALLBACKS": str(fallbacks)}
    gateway = Uvicorn("gateway:app", EXAMPLES, env)
    # Two more gateways whose ctxbudget is unreachable: failing closed and open.
    nowhere = {**env, "CTXBUDGET_TARGET": f"127.0.0.1:{free_port()}"}
    closed = Uvicorn("gateway:app", EXAMPLES, {**nowhere, "ON_UNAVAILABLE": "deny"})
    open_ = Uvicorn("gateway:app", EXAMPLES, {**nowhere, "ON_UNAVAILABLE": "allow"})
    yield service, upstream, gateway, closed, open_
    for p in (open_, closed, gateway, upstream):
        p.stop()
    service.stop()


def sdk(gateway, key):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0)


def user_left(service, user, dimension):
    with BudgetClient(service.target) as c:
        s = c.get_status("acme", "free", user=user)
        return next(l.remaining for l in s.limits if l.level == pb.LEVEL_USER and l.dimension == dimension)


MESSAGES = [{"role": "user", "content": "Say something short about budgets, please."}]


def test_answers_and_streams_pass_through_and_commit_their_usage(stack):
    service, upstream, gateway, *_ = stack
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
    service, _, gateway, *_ = stack
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


def reserved_prompt(service, messages) -> int:
    """The prompt as the gateway's reservation reserved it: the service's
    count × its estimator's multiplier (a probe, refunded)."""
    with BudgetClient(service.target) as c:
        probe = c.check_and_reserve(tenant="acme", user="probe", tier="free", model="gpt-4o",
                                    messages=messages, max_output_tokens=1)
        c.refund(probe.reservation_id)
        return probe.reserved_tokens - probe.granted_max_output_tokens


def counted(service, text) -> int:
    """The service's count of a completion's text."""
    with BudgetClient(service.target) as c:
        probe = c.check_and_reserve(tenant="acme", user="probe", tier="free", model="gpt-4o", prompt=text, max_output_tokens=1)
        c.refund(probe.reservation_id)
        return probe.estimated_prompt_tokens


def wait_for(check, seconds=10):
    deadline = time.time() + seconds
    while not check() and time.time() < deadline:
        time.sleep(0.05)


def sse_text(lines) -> str:
    return "".join((c.get("delta") or {}).get("content") or ""
                   for line in lines if line.startswith("data: {") for c in json.loads(line[6:]).get("choices", []))


def test_an_upstream_failure_refunds_and_a_caller_gone_mid_stream_commits_what_it_got(stack):
    service, upstream, gateway, *_ = stack
    client = sdk(gateway, "sk-dave")
    tokens = user_left(service, "dave", pb.DIMENSION_TOKENS)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, metadata={"mock_status": "400"})
    assert user_left(service, "dave", pb.DIMENSION_TOKENS) == tokens, "refunded"
    prompt = reserved_prompt(service, MESSAGES)
    # A slow stream the caller abandons after its first chunk.
    with httpx.stream("POST", gateway.url + "/v1/chat/completions",
                      headers={"Authorization": "Bearer sk-dave"},
                      json={"model": "gpt-4o", "messages": MESSAGES, "stream": True,
                            "metadata": {"mock_delay_ms": "3000"}}) as s:
        # Hold the iterator: dropping it closes the response (a disconnect).
        lines = s.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")
        assert user_left(service, "dave", pb.DIMENSION_CONCURRENCY) == 1, "one slot held while streaming"
        assert user_left(service, "dave", pb.DIMENSION_REQUESTS) == 5
    wait_for(lambda: user_left(service, "dave", pb.DIMENSION_CONCURRENCY) == 2)
    assert user_left(service, "dave", pb.DIMENSION_CONCURRENCY) == 2, "the slot came back"
    delivered = sse_text([first])
    assert delivered, first
    wait_for(lambda: user_left(service, "dave", pb.DIMENSION_TOKENS) != tokens)
    assert tokens - user_left(service, "dave", pb.DIMENSION_TOKENS) == prompt + counted(service, delivered), \
        "committed: the prompt as reserved and the text that reached the caller, not refunded"
    assert user_left(service, "dave", pb.DIMENSION_REQUESTS) == 5, "the request counts (the failed one came back)"


def test_a_stream_without_usage_commits_the_counted_text_and_one_that_delivered_nothing_refunds(stack):
    service, upstream, gateway, *_ = stack
    tokens = user_left(service, "gina", pb.DIMENSION_TOKENS)
    prompt = reserved_prompt(service, MESSAGES)
    # The upstream sends no usage chunk, though the gateway asks for one.
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-gina"},
                      json={"model": "gpt-4o", "messages": MESSAGES, "stream": True,
                            "metadata": {"mock_no_usage": "1"}}) as s:
        lines = [line for line in s.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and not any('"usage": {' in line for line in lines)
    text = sse_text(lines)
    assert text == "All right, here is a reply from the mock."
    wait_for(lambda: user_left(service, "gina", pb.DIMENSION_TOKENS) != tokens)
    assert tokens - user_left(service, "gina", pb.DIMENSION_TOKENS) == prompt + counted(service, text)
    # The caller gives up before the first chunk: nothing delivered, refunded.
    tokens = user_left(service, "gina", pb.DIMENSION_TOKENS)
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-gina"},
                      json={"model": "gpt-4o", "messages": MESSAGES, "stream": True,
                            "metadata": {"mock_first_delay_ms": "3000"}}) as s:
        assert s.status_code == 200
        assert user_left(service, "gina", pb.DIMENSION_CONCURRENCY) == 1
    wait_for(lambda: user_left(service, "gina", pb.DIMENSION_CONCURRENCY) == 2)
    assert user_left(service, "gina", pb.DIMENSION_CONCURRENCY) == 2
    assert user_left(service, "gina", pb.DIMENSION_TOKENS) == tokens, "refunded"
    assert user_left(service, "gina", pb.DIMENSION_REQUESTS) == 5, "the request came back too"


def test_ctxbudget_errors_are_400_for_the_caller_and_503_when_it_does_not_answer(stack):
    service, upstream, gateway, closed, _ = stack
    before = httpx.get(upstream.url + "/stats").json()["requests"]
    with pytest.raises(openai.BadRequestError) as e:
        sdk(gateway, "sk-erin").chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert "unknown tier" in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        sdk(gateway, "sk-frank").chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert "tenant_id" in e.value.body["message"], e.value.body
    with pytest.raises(openai.InternalServerError) as e:
        sdk(closed, "sk-alice").chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
    assert httpx.get(upstream.url + "/stats").json()["requests"] == before, "none reached the upstream"


def test_a_call_let_through_unbudgeted_keeps_the_callers_own_cap(stack):
    """ctxbudget unreachable and ON_UNAVAILABLE=allow: the call goes upstream
    with the caller's max_tokens, or none — never max_tokens = 0."""
    _, upstream, _, _, open_ = stack
    httpx.post(upstream.url + "/reset")
    client = sdk(open_, "sk-alice")
    reply = client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert reply.usage.completion_tokens == 20
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=7)
    sent = [r["body"] for r in httpx.get(upstream.url + "/received").json()]
    assert "max_tokens" not in sent[0] and "max_completion_tokens" not in sent[0], sent[0]
    assert sent[1]["max_tokens"] == 7


def test_the_clients_readme_examples_run(stack, monkeypatch):
    """The Python blocks of clients/python/README.md, run as written against
    the service and the mock upstream (the openai SDK pointed at it): every
    name they use is defined, a completion commits its usage, a stream its
    final usage."""
    import asyncio
    import re

    service, upstream, *_ = stack
    readme = (REPO / "clients" / "python" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) >= 2
    monkeypatch.setenv("OPENAI_BASE_URL", upstream.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-mock")
    code = "\n".join(blocks).replace("127.0.0.1:50051", service.target)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)

    def left():
        with BudgetClient(service.target) as c:
            s = c.get_status("acme", "pro", user="alice")
            return next(l.remaining for l in s.limits if l.level == pb.LEVEL_TENANT and l.dimension == pb.DIMENSION_TOKENS)

    async def run():
        before = left()
        status, headers, text = await scope["complete"]([{"role": "user", "content": "Hello from the README"}])
        assert status == 200 and text and headers["x-ratelimit-limit-tokens"] == "1000000"
        pieces = [p async for p in scope["stream"]([{"role": "user", "content": "Stream from the README"}])]
        assert "".join(pieces) == "All right, here is a reply from the mock."
        await scope["budget"].close()
        return before

    httpx.post(upstream.url + "/reset")
    before = asyncio.run(run())
    s = httpx.get(upstream.url + "/stats").json()
    assert before - left() == s["prompt_tokens"] + s["completion_tokens"], "both calls' usage committed"


def test_a_spent_model_falls_back_to_the_next_with_room(stack):
    _, _, gateway, _, _ = stack
    client = sdk(gateway, "sk-gina")
    # tiny takes one call an hour: the next goes to the fallback instead of
    # a 429.
    models = [
        client.chat.completions.create(model="tiny-1", messages=MESSAGES, max_tokens=150).model
        for _ in range(2)
    ]
    assert models == ["tiny-1", "gpt-4o-mini"]
