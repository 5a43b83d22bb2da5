"""ctxbudget as Envoy's external processor, through a real Envoy 1.40 started
on the bootstrap docs/ext_proc.md shows (addresses, ports and the token
substituted, nothing else), in front of the TLS mock upstream, driven by the
official ``openai`` and ``anthropic``-shaped HTTP calls: a buffered call
commits the reported usage; streams commit their usage chunk (asked for by
ctxbudget when the caller did not) or, from a provider that sends none, the
text delivered; 429 and 413 come in OpenAI's and Anthropic's shapes with
their headers; 5 parallel slow calls against a concurrency of 2; an upstream
500 is refunded; a client gone mid-stream frees its slot; a caller's smaller
output limit reaches the upstream; ctxbudget stopped answers Envoy's empty
500, and Envoy recovers on its own once it is back. With traces on, a call
that came with a ``traceparent`` is reserved and settled in spans of the
caller's trace, the settlement linked to the reservation."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

from conftest import Service, free_port
from ctxbudget import BudgetClient, pb
from envoy_proxy import Envoy, TlsUpstream, docs_bootstrap, substitute, wait_for
from otlp_receiver import GrpcReceiver
from test_traces import child_of, traceparent

TOKEN = "envoy-test-token-0123456789"

CONFIG = f"""
[reservations]
retry_jitter_ms = 0

[[auth.tokens]]
name = "envoy"
token = "{TOKEN}"

[tiers.free]
max_context_tokens = 8000
default_max_output_tokens = 50
user = {{ requests = [{{ limit = 1000, period = "1d" }}], tokens = [{{ limit = 1000000, period = "1d" }}], concurrency = 2 }}

[tiers.tight]
max_context_tokens = 8000
default_max_output_tokens = 50
user = {{ requests = [{{ limit = 1, period = "1d" }}] }}
"""

MESSAGES = [{"role": "user", "content": "Say something short about budgets, please."}]


class Stack:
    """ctxbudget on a fixed port (so it can be restarted there), the TLS
    mock upstream, and Envoy on the docs' bootstrap in front of both."""

    def __init__(self) -> None:
        self.port = free_port()
        self.receiver = GrpcReceiver()
        self.service = self.start_service()
        self.upstream = TlsUpstream()
        admin, listen = free_port(), free_port()
        bootstrap = substitute(
            docs_bootstrap("ext_proc.md"),
            admin=admin, listen=listen, ctxbudget=self.port, upstream=self.upstream.port, token=TOKEN,
        )
        self.envoy = Envoy(bootstrap, admin, listen)

    def start_service(self) -> Service:
        telemetry = f'\n[telemetry]\notlp_endpoint = "{self.receiver.endpoint}"\n'
        return Service(CONFIG + telemetry, port=self.port)

    def budget(self) -> BudgetClient:
        return BudgetClient(self.service.target, token=TOKEN)

    def user_tokens_left(self, user: str) -> int:
        with self.budget() as c:
            s = c.get_status("acme", "free", user=user)
        return next(l.remaining for l in s.limits if l.level == pb.LEVEL_USER and l.dimension == pb.DIMENSION_TOKENS)

    def in_flight(self, user: str) -> int:
        with self.budget() as c:
            s = c.get_status("acme", "free", user=user)
        return sum(l.active for l in s.leases if l.level == pb.LEVEL_USER)

    def stop(self) -> None:
        self.envoy.stop()
        self.upstream.stop()
        self.service.stop()
        self.receiver.stop()


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    yield s
    s.stop()


def headers(user: str, tier: str = "free") -> dict[str, str]:
    return {"x-tenant-id": "acme", "x-user-id": user, "x-tier": tier}


def sdk(stack: Stack, user: str, tier: str = "free") -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.envoy.url + "/v1", api_key="sk-upstream", max_retries=0,
                         default_headers=headers(user, tier))


def test_a_buffered_call_commits_the_reported_usage(stack):
    before = stack.user_tokens_left("buffered")
    r = sdk(stack, "buffered").chat.completions.with_raw_response.create(model="gpt-4o", messages=MESSAGES, max_tokens=30)
    answer = r.parse()
    assert answer.usage is not None and answer.usage.total_tokens > 0
    # ctxbudget's own headers, describing the caller's budget, not the account's.
    assert r.headers["x-ratelimit-limit-tokens"] == "1000000"
    # Settled at the usage the provider reported: nothing more, nothing less.
    assert wait_for(lambda: before - stack.user_tokens_left("buffered") == answer.usage.total_tokens), (
        before - stack.user_tokens_left("buffered"), answer.usage)
    assert stack.in_flight("buffered") == 0


def test_a_call_is_reserved_and_settled_in_the_callers_trace(stack):
    header, trace_id, parent = traceparent()
    answer = sdk(stack, "traced").chat.completions.create(
        model="gpt-4o", messages=MESSAGES, max_tokens=30, extra_headers={"traceparent": header})
    assert answer.usage is not None
    reserved = stack.receiver.wait_for(child_of(trace_id, parent, "ExtProc/CheckAndReserve"))
    assert reserved.attributes["ctxbudget.tenant"] == "acme"
    assert reserved.attributes["ctxbudget.decision"] == "allowed"
    committed = stack.receiver.wait_for(child_of(trace_id, parent, "ExtProc/Commit"))
    assert (reserved.trace_id, reserved.span_id) in committed.links


def test_streams_commit_their_usage_asked_for_or_not(stack):
    client = sdk(stack, "streams")
    # Without stream_options: ctxbudget adds include_usage, so the caller
    # receives the usage chunk and the provider's count is committed.
    before = stack.user_tokens_left("streams")
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=20, stream=True))
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1, "the usage chunk was asked for on the caller's behalf"
    assert stack.upstream.get("/received")[-1]["body"]["stream_options"] == {"include_usage": True}
    assert wait_for(lambda: before - stack.user_tokens_left("streams") == usage[0].total_tokens)
    # With it, the same.
    before = stack.user_tokens_left("streams")
    chunks = list(client.chat.completions.create(
        model="gpt-4o", messages=MESSAGES, max_tokens=20, stream=True, stream_options={"include_usage": True}))
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1
    assert wait_for(lambda: before - stack.user_tokens_left("streams") == usage[0].total_tokens)
    assert stack.in_flight("streams") == 0


def test_a_provider_that_sends_no_usage_is_charged_the_text_delivered(stack):
    client = sdk(stack, "no-usage")
    before = stack.user_tokens_left("no-usage")
    r = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=MESSAGES, max_tokens=20, stream=True, extra_headers={"x-mock-no-usage": "1"})
    text = "".join(c.choices[0].delta.content or "" for c in r.parse() if c.choices)
    assert text, "the answer streamed"
    # The prompt as reserved plus the text delivered, counted: more than the
    # prompt, less than the prompt plus the whole grant of 20.
    taken = wait_for(lambda: before - stack.user_tokens_left("no-usage"))
    with stack.budget() as c:
        reserved = c.check_and_reserve(tenant="acme", user="probe", tier="free", model="gpt-4o",
                                       messages=MESSAGES, max_output_tokens=1)
        c.refund(reserved.reservation_id)
    prompt = reserved.reserved_tokens - 1
    assert prompt < taken <= prompt + 20, (taken, prompt)
    assert stack.in_flight("no-usage") == 0


def test_denials_are_429_and_413_in_the_callers_api_with_their_headers(stack):
    # The tight tier's one request a day, then a 429 in OpenAI's shape.
    client = sdk(stack, "denied", tier="tight")
    client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10)
    with pytest.raises(openai.RateLimitError) as denied:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10)
    e = denied.value
    assert e.status_code == 429
    body = e.response.json()
    assert body["error"]["code"] == "rpm_exceeded" and body["error"]["ctxbudget"]["level"] == "user", body
    assert int(e.response.headers["retry-after"]) > 0
    assert e.response.headers["x-ratelimit-limit-requests"] == "1"
    assert e.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert e.response.headers["content-type"] == "application/json"
    # Anthropic's shape on /v1/messages.
    r = httpx.post(stack.envoy.url + "/v1/messages", headers={**headers("denied", "tight"), "anthropic-version": "2023-06-01"},
                   json={"model": "claude-sonnet-4", "max_tokens": 10, "messages": MESSAGES}, timeout=10)
    assert r.status_code == 429, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error", r.text
    assert r.headers["retry-after"] and r.headers["x-ratelimit-remaining-requests"] == "0"
    # A prompt that can never fit the tier's context: 413, no retry-after.
    huge = [{"role": "user", "content": "budget " * 9000}]
    with pytest.raises(openai.APIStatusError) as too_large:
        sdk(stack, "big").chat.completions.create(model="gpt-4o", messages=huge, max_tokens=10)
    assert too_large.value.status_code == 413
    assert too_large.value.response.json()["error"]["code"] == "context_too_large"
    assert "retry-after" not in too_large.value.response.headers
    r = httpx.post(stack.envoy.url + "/v1/messages", headers={**headers("big"), "anthropic-version": "2023-06-01"},
                   json={"model": "claude-sonnet-4", "max_tokens": 10, "messages": huge}, timeout=10)
    assert r.status_code == 413 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["ctxbudget"]["reason"] == "context_too_large"


def test_five_parallel_slow_calls_meet_a_concurrency_of_two(stack):
    stack.upstream.reset()
    client = sdk(stack, "parallel")

    def call(_):
        try:
            client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10,
                                           extra_headers={"x-mock-delay-ms": "3000"})
            return 200
        except openai.RateLimitError as e:
            assert e.response.json()["error"]["code"] == "concurrency_exceeded"
            return 429

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        codes = sorted(pool.map(call, range(5)))
    assert codes == [200, 200, 429, 429, 429], codes
    assert stack.upstream.get("/stats")["max_in_flight"] == 2
    assert wait_for(lambda: stack.in_flight("parallel") == 0)


def test_an_upstream_failure_is_refunded(stack):
    before = stack.user_tokens_left("failed")
    with pytest.raises(openai.InternalServerError):
        sdk(stack, "failed").chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10,
                                                     extra_headers={"x-mock-status": "500"})
    assert wait_for(lambda: stack.in_flight("failed") == 0)
    assert stack.user_tokens_left("failed") == before, "a failed call costs nothing"


def test_a_client_gone_mid_stream_frees_its_slot_and_pays_what_it_got(stack):
    before = stack.user_tokens_left("gone")
    # A slow stream (10 pieces over 5 s): its first event, then the client leaves.
    with httpx.stream("POST", stack.envoy.url + "/v1/chat/completions",
                      headers={**headers("gone"), "x-mock-delay-ms": "5000"}, timeout=10,
                      json={"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 20, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data:")
        assert stack.in_flight("gone") == 1, "the stream holds its slot"
        reserved = before - stack.user_tokens_left("gone")
    assert wait_for(lambda: stack.in_flight("gone") == 0), "the slot was freed when the client left"
    charged = before - stack.user_tokens_left("gone")
    # What reached the caller was charged: the prompt and some of the text,
    # not the whole grant of 20 it reserved.
    assert 0 < charged < reserved, (charged, reserved)


def test_a_callers_smaller_output_limit_reaches_the_upstream(stack):
    sdk(stack, "limits").chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10,
                                                 extra_body={"max_completion_tokens": 30})
    body = stack.upstream.get("/received")[-1]["body"]
    assert (body["max_tokens"], body["max_completion_tokens"]) == (10, 30), body


def test_with_ctxbudget_down_envoy_answers_500_and_recovers_once_it_is_back(stack):
    stack.service.stop()
    try:
        for path in ("/v1/chat/completions", "/v1/models"):
            r = httpx.post(stack.envoy.url + path, headers=headers("restart"), timeout=10,
                           json={"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 5})
            # failure_mode_allow: false — Envoy's own empty 500, on every
            # path the filter covers (an LLM call or not).
            assert r.status_code == 500, (path, r.status_code, r.text)
            assert r.content == b"", r.text
    finally:
        stack.service = stack.start_service()

    def served() -> bool:
        r = httpx.post(stack.envoy.url + "/v1/chat/completions", headers=headers("restart"), timeout=10,
                       json={"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 5})
        return r.status_code == 200

    assert wait_for(served, 30), "Envoy reconnects on its own"
    assert json.loads(httpx.post(stack.envoy.url + "/v1/chat/completions", headers=headers("restart"), timeout=10,
                                 json={"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 5}).text)["usage"]
