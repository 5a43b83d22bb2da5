"""ctxbudget as a LiteLLM proxy hook (``ctxbudget.litellm``), with the real
``litellm[proxy]``: two proxy instances share one ctxbudget on Redis, in
front of the mock upstream, and 200 concurrent requests meet exact limits —
concurrency, requests per minute, tokens per minute — across both. Also:
the granted output cap reaches the upstream in the chat, Responses and
Anthropic formats; ctxbudget's errors answer 400 / 503, not 500; a stream
that breaks after chunks went out commits what was delivered; each call's
session (LiteLLM's session or trace id) meets the tier's session limits."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import pytest

# No network here: LiteLLM's bundled model cost map, not a download.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="scripts/test.sh installs litellm[proxy]")

from conftest import REPO, Redis, Service, Uvicorn, free_port  # noqa: E402
from otlp_receiver import GrpcReceiver  # noqa: E402
from test_traces import traceparent  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Exact limits need the shared store's answer: the default "local" policy
# decides from this replica's memory when Redis is slow (a loaded CI machine
# stalls it past the 50 ms deadline), trading exactness for availability.
CONFIG = """
[store]
timeout_ms = 2000

[resilience]
policy = "fail_closed"

[reservations]
retry_jitter_ms = 0

[global]
requests = [{ limit = 100000, period = "1m" }]

[tiers.conc]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { concurrency = 5 }

[tiers.rpm]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { requests = [{ limit = 50, period = "1m" }] }

[tiers.stream]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { tokens = [{ limit = 1000000, window = "day" }] }

[tiers.fmt]
max_context_tokens = 100000
default_max_output_tokens = 18
tenant = { tokens = [{ limit = 1000000, window = "day" }] }

[tiers.gone]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { tokens = [{ limit = 1000000, window = "day" }], concurrency = 2 }

[tiers.tpm]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { tokens = [{ limit = 3000, period = "1m" }] }

[tiers.sess]
max_context_tokens = 100000
default_max_output_tokens = 20
tenant = { tokens = [{ limit = 1000000, window = "day" }] }
session = { requests = [{ limit = 2, period = "1h" }] }
"""

PROXY_CONFIG = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_base: {upstream}/v1
      api_key: sk-upstream
      extra_headers: {{x-mock-delay-ms: "300"}}
  - model_name: gpt-4o-broken
    litellm_params:
      model: openai/gpt-4o
      api_base: {upstream}/v1
      api_key: sk-upstream
      max_retries: 0
      extra_headers: {{x-mock-status: "500"}}
  - model_name: gpt-4o-cut
    litellm_params:
      model: openai/gpt-4o
      api_base: {upstream}/v1
      api_key: sk-upstream
      max_retries: 0
      extra_headers: {{x-mock-break-after: "2", x-mock-no-usage: "1"}}
  - model_name: gpt-4o-slow
    litellm_params:
      model: openai/gpt-4o
      api_base: {upstream}/v1
      api_key: sk-upstream
      max_retries: 0
      extra_headers: {{x-mock-delay-ms: "4000"}}
  - model_name: claude-mock
    litellm_params:
      model: anthropic/claude-3-5-sonnet-20240620
      api_base: {upstream}
      api_key: sk-upstream
litellm_settings:
{callbacks}
  num_retries: 0
general_settings:
  custom_auth: custom_auth.user_api_key_auth
{general_extra}
router_settings:
  redis_host: 127.0.0.1
  redis_port: {redis_port}
environment_variables:
  CTXBUDGET_TARGET: "{target}"
  CTXBUDGET_TENANT_FROM: team_id
  CTXBUDGET_USER_FROM: user_id
  CTXBUDGET_TIER_FROM: metadata.tier
"""


class Proxy:
    """A LiteLLM proxy process on a free port."""

    def __init__(self, config_dir: str, config: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = os.path.join(config_dir, "config.yaml")
        with open(path, "w") as f:
            f.write(config)
        env = dict(os.environ, LITELLM_OFFLINE_MODE="true", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   LITELLM_TELEMETRY="False", DISABLE_ADMIN_UI="True", LITELLM_MASTER_KEY="sk-master-test")
        litellm_bin = os.path.join(os.path.dirname(sys.executable), "litellm")
        self.log = open(os.path.join(config_dir, f"proxy-{self.port}.log"), "w")
        self.proc = subprocess.Popen([litellm_bin, "--config", path, "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=config_dir)

    def wait(self) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited: {open(self.log.name).read()[-3000:]}")
            try:
                if httpx.get(self.url + "/health/liveliness", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError("litellm did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def start_proxies(tmp, upstream, redis, callbacks: str, target: str, general_extra: str = "") -> list[Proxy]:
    proxies = []
    for i in range(2):
        d = tmp / f"proxy{i}-{'ctxbudget' if 'ctxbudget' in callbacks else 'native'}"
        d.mkdir()
        shutil.copy(os.path.join(HERE, "litellm_proxy", "custom_auth.py"), d)
        cfg = PROXY_CONFIG.format(upstream=upstream.url, redis_port=redis.port, target=target, callbacks=callbacks,
                                  general_extra=general_extra.format(redis_port=redis.port))
        proxies.append(Proxy(str(d), cfg))
    for p in proxies:
        p.wait()
    return proxies


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("litellm")
    redis = Redis()
    receiver = GrpcReceiver()
    service = Service(CONFIG + f'\n[telemetry]\notlp_endpoint = "{receiver.endpoint}"\n', redis_url=redis.url)
    upstream = Uvicorn("mock_upstream:app", str(REPO / "examples" / "python"))
    proxies = start_proxies(tmp, upstream, redis, "  callbacks: ctxbudget.litellm.handler", service.target)
    yield service, upstream, proxies, redis, tmp, receiver
    for p in proxies:
        p.stop()
    upstream.stop()
    service.stop()
    redis.stop()
    receiver.stop()


async def burst(proxies, key: str, n: int, **extra) -> list[httpx.Response]:
    """``n`` concurrent chat completions, alternating between the proxies."""
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=400)) as c:
        async def one(i):
            url = proxies[i % len(proxies)].url + "/v1/chat/completions"
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"Hello number {i}, tell me about budgets."}], **extra}
            return await c.post(url, json=body, headers={"Authorization": f"Bearer {key}"})
        return await asyncio.gather(*(one(i) for i in range(n)))


def stats(upstream):
    return httpx.get(upstream.url + "/stats").json()


def test_two_proxies_never_exceed_the_concurrency_limit(setup):
    service, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    replies = asyncio.run(burst(proxies, "sk-conc", 200))
    ok = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    s = stats(upstream)
    assert s["max_in_flight"] <= 5, f"at most 5 in flight at the upstream: {s}"
    assert len(ok) == s["requests"] and len(ok) >= 5, (len(ok), s)
    assert len(ok) + len(refused) == 200, sorted({r.status_code for r in replies})
    print(f"\nctxbudget, concurrency 5, 200 requests over 2 proxies: {len(ok)} served, max in flight {s['max_in_flight']}")


def test_two_proxies_admit_exactly_the_requests_per_minute(setup):
    service, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    t0 = time.monotonic()
    replies = asyncio.run(burst(proxies, "sk-rpm", 200))
    elapsed = time.monotonic() - t0
    ok = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    # A rolling limit: 50 at once, then refilled at 50 a minute — during a
    # burst of a few seconds on a busy machine, one or two more.
    most = 50 + int(elapsed * 50 / 60)
    assert 50 <= len(ok) <= most, f"{len(ok)} admitted in {elapsed:.1f} s, at most {most}"
    assert stats(upstream)["requests"] == len(ok), "every admitted call, and only those, reached the upstream"
    assert len(refused) == 200 - len(ok)
    h = refused[0].headers
    assert int(h["retry-after"]) >= 1, dict(h)
    assert h["x-ratelimit-limit-requests"] == "50" and h["x-ratelimit-remaining-requests"] == "0", dict(h)
    print(f"\nctxbudget, 50 RPM, 200 requests over 2 proxies: {len(ok)} reached the upstream in {elapsed:.1f} s")


def test_two_proxies_admit_no_more_tokens_than_the_limit_and_one_overage(setup):
    service, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    t0 = time.monotonic()
    replies = asyncio.run(burst(proxies, "sk-tpm", 200, max_tokens=20))
    elapsed = time.monotonic() - t0
    ok = [r for r in replies if r.status_code == 200]
    used = [r.json()["usage"]["total_tokens"] for r in ok]
    s = stats(upstream)
    assert sum(used) == s["prompt_tokens"] + s["completion_tokens"]
    # Reserved is the counted prompt + 20; the mock bills chars / 4: each
    # request can overrun its reservation by a little, one at a time. The
    # rolling limit also refills 50 tokens a second during the burst.
    most = 3000 + int(elapsed * 3000 / 60) + max(used)
    assert sum(used) <= most, f"{sum(used)} tokens admitted in {elapsed:.1f} s, at most {most}"
    assert len(ok) < 200
    print(f"\nctxbudget, 3000 TPM, 200 requests over 2 proxies: {len(ok)} served, {sum(used)} tokens")


def tenant_tokens_left(service, tenant: str, tier: str) -> int:
    from ctxbudget import BudgetClient, pb

    with BudgetClient(service.target) as c:
        s = c.get_status(tenant, tier)
        return next(l.remaining for l in s.limits if l.level == pb.LEVEL_TENANT and l.dimension == pb.DIMENSION_TOKENS)


def test_the_hooks_reservation_joins_the_callers_trace(setup):
    service, upstream, proxies, *_, receiver = setup
    header, trace_id, parent = traceparent()
    r = httpx.post(proxies[0].url + "/v1/chat/completions", timeout=60,
                   json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello, traced."}], "max_tokens": 20},
                   headers={"Authorization": "Bearer sk-traced", "traceparent": header})
    assert r.status_code == 200, r.text
    span = receiver.wait_for(lambda s: s.trace_id == trace_id and s.name == "CheckAndReserve")
    assert span.parent_span_id == parent
    assert span.attributes["ctxbudget.decision"] == "allowed"


def test_a_stream_commits_its_final_usage_and_a_failure_refunds(setup):
    import openai

    service, upstream, proxies, *_ = setup
    client = openai.OpenAI(base_url=proxies[0].url + "/v1", api_key="sk-stream", max_retries=0)
    # A calendar-day limit: no refill, so every token shows.
    before = tenant_tokens_left(service, "stream", "stream")
    chunks = list(client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Stream me a short answer."}],
        max_tokens=20, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 20
    # The commit runs in LiteLLM's logging task, just after the stream ends.
    deadline = time.time() + 10
    while tenant_tokens_left(service, "stream", "stream") != before - usage.total_tokens and time.time() < deadline:
        time.sleep(0.05)
    assert tenant_tokens_left(service, "stream", "stream") == before - usage.total_tokens, "the stream's real usage"
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o-broken", messages=[{"role": "user", "content": "fail"}], max_tokens=20)
    deadline = time.time() + 10
    while tenant_tokens_left(service, "stream", "stream") != before - usage.total_tokens and time.time() < deadline:
        time.sleep(0.05)
    assert tenant_tokens_left(service, "stream", "stream") == before - usage.total_tokens, "the failed call was refunded"


def wait_for(check, seconds=10):
    deadline = time.time() + seconds
    while not check() and time.time() < deadline:
        time.sleep(0.05)


def test_the_granted_output_cap_reaches_the_upstream_in_every_format(setup):
    """Chat completions, the Responses API and Anthropic-format messages
    (to an Anthropic model, and translated to an OpenAI one): the upstream
    receives the cap ctxbudget granted — the tier's default of 18 when the
    caller named none, else the caller's — and the usage each answers is
    what is committed."""
    service, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    before = tenant_tokens_left(service, "fmt", "fmt")
    auth = {"Authorization": "Bearer sk-fmt"}
    chat = [{"role": "user", "content": "Say something about output caps."}]
    chat_path, responses_path, messages_path = "/v1/chat/completions", "/v1/responses", "/v1/messages"
    # (path, body, the cap the upstream must see, where LiteLLM sends it).
    calls = [
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": chat}, 18, {chat_path}),
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": chat, "max_tokens": 7}, 7, {chat_path}),
        ("/v1/chat/completions", {"model": "gpt-4o", "messages": chat, "max_completion_tokens": 9}, 9, {chat_path}),
        ("/v1/responses", {"model": "gpt-4o", "input": "Say something about output caps."}, 18, {responses_path}),
        ("/v1/responses", {"model": "gpt-4o", "instructions": "Be brief.", "max_output_tokens": 17,
                           "input": [{"role": "user", "content": [{"type": "input_text", "text": "Caps?"}]}]}, 17,
         {responses_path}),
        ("/v1/messages", {"model": "claude-mock", "max_tokens": 17, "system": "Be brief.", "messages": chat}, 17,
         {messages_path}),
        # Anthropic's format to an OpenAI model: LiteLLM translates it (to
        # the Responses API in 1.110).
        ("/v1/messages", {"model": "gpt-4o", "max_tokens": 16, "messages": chat}, 16, {chat_path, responses_path}),
    ]
    for path, body, want, reached in calls:
        reply = httpx.post(proxies[0].url + path, json=body, headers=auth, timeout=60)
        assert reply.status_code == 200, (path, body, reply.text)
        got = httpx.get(upstream.url + "/received").json()[-1]
        cap = got["body"].get("max_output_tokens") or got["body"].get("max_tokens") or got["body"].get("max_completion_tokens")
        assert got["path"] in reached and cap == want, (path, body, got)
        assert "ctxbudget" not in json.dumps(got["body"]), ("the hook's keys stay in LiteLLM", got)
        s = stats(upstream)
        billed = s["prompt_tokens"] + s["completion_tokens"]
        wait_for(lambda: before - tenant_tokens_left(service, "fmt", "fmt") == billed)
        assert before - tenant_tokens_left(service, "fmt", "fmt") == billed, ("the usage answered is committed", path, body, reply.json())
    assert len(httpx.get(upstream.url + "/received").json()) == len(calls)


def test_ctxbudget_errors_answer_400_for_the_caller_not_500(setup):
    service, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    for key, says in (("sk-badtier", "unknown tier"), ("sk-badid", "tenant_id")):
        reply = httpx.post(proxies[0].url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        assert reply.status_code == 400, (key, reply.status_code, reply.text)
        assert says in reply.text, reply.text
    assert stats(upstream)["requests"] == 0, "never reached the upstream"


def reserved_prompt(service, tier, model, messages) -> int:
    """The prompt as the hook's reservation reserved it (a probe, refunded)."""
    from ctxbudget import BudgetClient

    with BudgetClient(service.target) as c:
        probe = c.check_and_reserve(tenant="probe", tier=tier, model=model, messages=messages, max_output_tokens=1)
        c.refund(probe.reservation_id)
        return probe.reserved_tokens - probe.granted_max_output_tokens


def counted(service, tier, text) -> int:
    from ctxbudget import BudgetClient

    with BudgetClient(service.target) as c:
        probe = c.check_and_reserve(tenant="probe", tier=tier, model="gpt-4o", prompt=text, max_output_tokens=1)
        c.refund(probe.reservation_id)
        return probe.estimated_prompt_tokens


def test_a_stream_that_breaks_after_chunks_went_out_commits_what_was_delivered(setup):
    """The upstream drops the connection after two chunks, without usage:
    LiteLLM reports the call failed, but the provider bills it — committed
    as the prompt reserved and the delivered text, counted by ctxbudget."""
    service, upstream, proxies, *_ = setup
    messages = [{"role": "user", "content": "Stream me something, then break."}]
    before = tenant_tokens_left(service, "cut", "stream")
    prompt = reserved_prompt(service, "stream", "gpt-4o-cut", messages)
    with httpx.stream("POST", proxies[1].url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-cut"},
                      json={"model": "gpt-4o-cut", "messages": messages, "stream": True}, timeout=60) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: {")]
    events = [json.loads(line[6:]) for line in lines]
    assert any("error" in e for e in events), f"LiteLLM reports the break in the stream: {events}"
    delivered = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices") or [])
    assert delivered == "All right, here ", events
    want = prompt + counted(service, "stream", delivered)
    wait_for(lambda: before - tenant_tokens_left(service, "cut", "stream") == want)
    assert before - tenant_tokens_left(service, "cut", "stream") == want, "committed, not refunded"


def test_a_caller_gone_mid_stream_is_billed_and_frees_its_slot(setup):
    """The caller reads one chunk of a slow stream and hangs up: the call is
    settled (LiteLLM reports the partial stream; the hook commits it), not
    left holding its concurrency slot or refunded."""
    from ctxbudget import BudgetClient, pb

    service, upstream, proxies, *_ = setup

    def state():
        with BudgetClient(service.target) as c:
            s = c.get_status("gone", "gone")
            get = lambda d: next(e.remaining for e in s.limits if e.level == pb.LEVEL_TENANT and e.dimension == d)  # noqa: E731
            return get(pb.DIMENSION_TOKENS), get(pb.DIMENSION_CONCURRENCY)

    tokens, slots = state()
    with httpx.stream("POST", proxies[0].url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-gone"},
                      json={"model": "gpt-4o-slow", "messages": [{"role": "user", "content": "Go slowly."}], "stream": True},
                      timeout=60) as s:
        lines = s.iter_lines()
        first = next((line for line in lines if line.startswith("data: {")), None)
        # Shown with a failure: the answer and what the proxy logged (no chunk seen once in CI).
        assert first, (s.status_code, open(proxies[0].log.name).read()[-6000:])
        assert state()[1] == slots - 1, "a slot held while streaming"
    wait_for(lambda: state() != (tokens, slots - 1) and state()[1] == slots, seconds=15)
    left, free = state()
    assert free == slots, "the slot came back"
    assert 0 < tokens - left < 100, f"billed for the partial stream, not refunded: {tokens - left}"


def test_a_blocked_tenant_gets_a_403_with_the_operators_reason(setup):
    """``ctxbudget overrides block``: the hook answers 403 with the reason,
    and no Retry-After (waiting cannot help)."""
    from conftest import binary

    service, upstream, proxies, redis, *_ = setup
    subprocess.run([binary(), "overrides", "block", "blocked", "--reason", "unpaid invoice 42", "--redis-url", redis.url],
                   check=True, capture_output=True)

    def ask():
        return httpx.post(proxies[0].url + "/v1/chat/completions", headers={"Authorization": "Bearer sk-blocked"},
                          json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)

    wait_for(lambda: ask().status_code == 403)
    reply = ask()
    assert reply.status_code == 403, reply.text
    assert "unpaid invoice 42" in reply.text and "retry-after" not in reply.headers, (reply.text, dict(reply.headers))


def test_the_hook_answers_503_when_ctxbudget_does_not_answer_or_lets_the_call_through():
    """The hook's pre-call hook against an unreachable ctxbudget: 503 with
    Retry-After failing closed; failing open, the request as the caller sent
    it (no max_tokens of 0 when it named none)."""
    from fastapi import HTTPException
    from litellm.proxy._types import UserAPIKeyAuth

    from ctxbudget import AsyncBudgetClient
    from ctxbudget.litellm import CtxBudgetHook

    key = UserAPIKeyAuth(api_key="k", team_id="acme", user_id="u", metadata={"tier": "t"})
    nowhere = f"127.0.0.1:{free_port()}"

    async def run():
        async with AsyncBudgetClient(nowhere, timeout=0.5) as client:
            with pytest.raises(HTTPException) as e:
                await CtxBudgetHook(client=client).async_pre_call_hook(
                    key, None, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, "acompletion")
            assert e.value.status_code == 503 and e.value.headers == {"Retry-After": "1"}
        async with AsyncBudgetClient(nowhere, timeout=0.5, on_unavailable="allow") as client:
            hook = CtxBudgetHook(client=client)
            for call, data in (("acompletion", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
                               ("aresponses", {"model": "gpt-4o", "input": "hi"}),
                               ("anthropic_messages", {"model": "claude", "max_tokens": 5,
                                                       "messages": [{"role": "user", "content": "hi"}]})):
                sent = json.loads(json.dumps(data))
                assert await hook.async_pre_call_hook(key, None, data, call) == sent, call
            assert not hook._open

    asyncio.run(run())


@pytest.mark.comparison
def test_litellms_own_limiter_for_comparison(setup, capsys):
    """The same bursts with LiteLLM's own limits (max_parallel_requests,
    rpm_limit, tpm_limit on the key; the two instances share them through
    Redis with general_settings.coordination_redis) and no ctxbudget:
    measured and printed for the docs, not asserted (it is LiteLLM's
    behaviour)."""
    service, upstream, _, redis, tmp, _ = setup
    coordination = "  coordination_redis: {{host: 127.0.0.1, port: {redis_port}}}"
    native = start_proxies(tmp, upstream, redis, "", service.target, coordination)
    try:
        results = {}
        for key, extra in (("sk-native-conc", {}), ("sk-native-rpm", {}), ("sk-native-tpm", {"max_tokens": 20})):
            httpx.post(upstream.url + "/reset")
            replies = asyncio.run(burst(native, key, 200, **extra))
            s = stats(upstream)
            results[key] = (sum(r.status_code == 200 for r in replies), s["max_in_flight"], s["prompt_tokens"] + s["completion_tokens"])
        with capsys.disabled():
            print(f"\nLiteLLM's own limiter, 2 proxies, 200 requests each: "
                  f"max_parallel_requests=5 -> {results['sk-native-conc'][0]} served, max in flight {results['sk-native-conc'][1]}; "
                  f"rpm_limit=50 -> {results['sk-native-rpm'][0]} reached the upstream; "
                  f"tpm_limit=3000 -> {results['sk-native-tpm'][0]} served, {results['sk-native-tpm'][2]} tokens")
    finally:
        for p in native:
            p.stop()


def test_the_hook_commits_a_retried_call_refunds_a_failed_one_and_ignores_spoofed_ids():
    """The hook's methods called as LiteLLM calls them, against a real
    service: a failed attempt followed by a successful retry commits; a call
    that fails for good refunds; an id the caller put in its metadata is
    dropped."""
    from litellm.proxy._types import UserAPIKeyAuth

    from ctxbudget import AsyncBudgetClient, pb
    from ctxbudget.litellm import CtxBudgetHook

    service = Service("""
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 100000, window = "day" }] }
""")
    key = UserAPIKeyAuth(api_key="k", team_id="acme", user_id="u", metadata={"tier": "t"})

    async def run():
        async with AsyncBudgetClient(service.target) as client:
            hook = CtxBudgetHook(client=client)

            async def left():
                s = await client.get_status("acme", "t")
                return next(l.remaining for l in s.limits if l.level == pb.LEVEL_TENANT and l.dimension == pb.DIMENSION_TOKENS)

            full = await left()
            data = {"litellm_call_id": "c1", "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 10, "metadata": {"ctxbudget_reservation_id": "rsv_spoofed"}}
            data = await hook.async_pre_call_hook(key, None, data, "acompletion")
            assert data["metadata"]["ctxbudget_reservation_id"].startswith("rsv_") and \
                data["metadata"]["ctxbudget_reservation_id"] != "rsv_spoofed"
            assert data["max_tokens"] == 10
            # Attempt 1 fails, attempt 2 succeeds: committed, not refunded.
            logged = {"litellm_call_id": "c1", "litellm_params": {"metadata": dict(data["metadata"])}}
            await hook.async_log_failure_event(logged, None, None, None)
            usage = {"prompt_tokens": 7, "completion_tokens": 3}
            await hook.async_log_success_event(logged, {"usage": usage}, None, None)
            assert await left() == full - 10, "the retried call's real usage"
            # A call that fails for good: refunded at once.
            data2 = await hook.async_pre_call_hook(key, None, {"litellm_call_id": "c2", "model": "gpt-4o",
                                                               "messages": [{"role": "user", "content": "hi"}]}, "acompletion")
            assert await left() < full - 10
            # A second call claiming the same LiteLLM call id (the caller can
            # set it) is a reservation of its own.
            data3 = await hook.async_pre_call_hook(key, None, {"litellm_call_id": "c2", "model": "gpt-4o",
                                                               "messages": [{"role": "user", "content": "hi"}]}, "acompletion")
            assert len(hook._open) == 2
            await hook.async_post_call_failure_hook(data3, RuntimeError("upstream down"), key)
            await hook.async_log_failure_event({"litellm_params": {"metadata": data2["metadata"]}}, None, None, None)
            await hook.async_post_call_failure_hook(data2, RuntimeError("upstream down"), key)
            assert await left() == full - 10, "refunded"
            assert not hook._open
            # Calls that are not completions pass through untouched.
            assert await hook.async_pre_call_hook(key, None, {"input": "x"}, "aembedding") == {"input": "x"}

    try:
        asyncio.run(run())
    finally:
        service.stop()


def test_a_sessions_third_call_is_denied_and_another_session_passes(setup):
    """The session LiteLLM resolved for each call — the body's
    ``litellm_session_id``, the ``x-litellm-session-id`` header, the
    caller's ``metadata.session_id`` (on the Responses API too, where
    LiteLLM moves it into ``litellm_metadata``), else ``metadata.trace_id`` —
    meets the tier's limit of 2 requests per session, across both proxies;
    calls of other sessions, and calls naming none, pass."""
    _, upstream, proxies, *_ = setup
    httpx.post(upstream.url + "/reset")
    chat = [{"role": "user", "content": "One step of an agent run."}]

    def call(i: int, path: str = "/v1/chat/completions", headers: dict[str, str] | None = None, **body) -> httpx.Response:
        body = {"model": "gpt-4o", **({"input": "One step."} if path == "/v1/responses" else {"messages": chat}), **body}
        r = httpx.post(proxies[i % 2].url + path, json=body, timeout=60,
                       headers={"Authorization": "Bearer sk-sess", **(headers or {})})
        if r.status_code >= 500:
            # Shown with a failure: what the proxy logged (a 500 seen once in CI).
            print(r.text, open(proxies[i % 2].log.name).read()[-6000:])
        return r

    # run-1 named by the body's litellm_session_id.
    assert [call(i, litellm_session_id="run-1").status_code for i in range(2)] == [200, 200]
    denied = call(2, litellm_session_id="run-1")
    assert denied.status_code == 429, denied.text
    assert "session request limit of 2" in denied.text, denied.text
    assert denied.headers["x-ratelimit-limit-requests"] == "2" and denied.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(denied.headers["retry-after"]) >= 1
    # run-2, the same user's other session: by metadata, then the header,
    # then metadata on the Responses API (its third call).
    assert call(0, metadata={"session_id": "run-2"}).status_code == 200
    assert call(1, headers={"x-litellm-session-id": "run-2"}).status_code == 200
    third = call(0, "/v1/responses", metadata={"session_id": "run-2"})
    assert third.status_code == 429 and "session" in third.text, third.text
    # A trace id is a session when no session id is named.
    assert [call(i, metadata={"trace_id": "trace-1"}).status_code for i in range(3)] == [200, 200, 429]
    # No session named: no session level.
    assert [call(i).status_code for i in range(3)] == [200, 200, 200]
    served = 2 + 2 + 2 + 3
    assert stats(upstream)["requests"] == served, "every call the hook let through, and only those, reached the upstream"
    # A malformed session id is the caller's error, named.
    bad = call(0, metadata={"session_id": "run\t3"})
    assert bad.status_code == 400 and "session_id" in bad.text, bad.text
    assert stats(upstream)["requests"] == served


def test_the_session_setting_reads_what_it_names_or_nothing(monkeypatch):
    """``session_from`` (``CTXBUDGET_SESSION_FROM``) with the hook's
    pre-call hook against a real service: the default reads LiteLLM's
    fields (not a session id LiteLLM generated); ``none`` or empty leaves
    sessions off; a path reads what it names."""
    from litellm.proxy._types import UserAPIKeyAuth

    from ctxbudget import AsyncBudgetClient
    from ctxbudget.litellm import CtxBudgetHook

    service = Service(CONFIG)
    key = UserAPIKeyAuth(api_key="k", team_id="sess-setting", user_id="u", metadata={"tier": "sess"})
    monkeypatch.delenv("CTXBUDGET_SESSION_FROM", raising=False)

    def call(**data):
        return {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **data}

    async def statuses(hook: CtxBudgetHook, calls: list[dict]) -> list[int]:
        """Each call's status through the hook (200: reserved, then refunded
        as a call that failed)."""
        from fastapi import HTTPException

        out = []
        for data in calls:
            try:
                data = await hook.async_pre_call_hook(key, None, data, "acompletion")
            except HTTPException as e:
                out.append(e.status_code)
                continue
            out.append(200)
            await hook.async_post_call_failure_hook(data, RuntimeError("not sent"), key)
        assert not hook._open
        return out

    async def run():
        async with AsyncBudgetClient(service.target) as client:
            # Refunds give the requests back: hold them to count.
            one = [call(litellm_session_id="s-1") for _ in range(3)]
            assert await statuses(CtxBudgetHook(client=client), one) == [200, 200, 200], "refunded, so never three held"
            holder, hook = CtxBudgetHook(client=client), CtxBudgetHook(client=client)
            held = [await holder.async_pre_call_hook(key, None, call(litellm_session_id="s-1"), "acompletion") for _ in range(2)]
            assert await statuses(hook, [call(litellm_session_id="s-1"), call(metadata={"session_id": "s-1"}),
                                         call(litellm_metadata={"session_id": "s-1"}),
                                         call(metadata={"existing_trace_id": "s-1"})]) == [429, 429, 429, 429]
            assert await statuses(hook, [call(litellm_session_id="s-2"), call()]) == [200, 200]
            # A session id LiteLLM generated is no session: the trace id, if
            # any, then none.
            generated = {"session_id": "s-1", "litellm_session_id_generated": True}
            assert await statuses(hook, [call(litellm_session_id="s-1", metadata=generated),
                                         call(litellm_session_id="s-1", metadata=dict(generated, trace_id="s-1"))]) == [200, 429]
            # Off: every call of session s-1 passes.
            for off in ("none", "", " None "):
                assert await statuses(CtxBudgetHook(client=client, session_from=off), [call(litellm_session_id="s-1")]) == [200], off
            monkeypatch.setenv("CTXBUDGET_SESSION_FROM", "none")
            assert await statuses(CtxBudgetHook(client=client), [call(litellm_session_id="s-1")]) == [200]
            monkeypatch.setenv("CTXBUDGET_SESSION_FROM", "")
            assert await statuses(CtxBudgetHook(client=client), [call(metadata={"session_id": "s-1"})]) == [200]
            # A path: the request metadata's "run", and nothing else.
            monkeypatch.setenv("CTXBUDGET_SESSION_FROM", "request.run")
            assert await statuses(CtxBudgetHook(client=client), [call(metadata={"run": "s-1"}), call(litellm_session_id="s-1")]) == [429, 200]
            # An explicit setting beats the environment.
            assert await statuses(CtxBudgetHook(client=client, session_from="litellm"), [call(litellm_session_id="s-1")]) == [429]
            for data in held:
                await holder.async_post_call_failure_hook(data, RuntimeError("not sent"), key)
            assert not holder._open

    try:
        asyncio.run(run())
    finally:
        service.stop()


def test_litellm_usage_objects_give_their_priced_parts() -> None:
    """LiteLLM's own Usage: cache reads and writes (with their TTLs) and
    reasoning tokens reach the Commit, within their whole."""
    from litellm.types.utils import Usage as LiteLLMUsage

    from ctxbudget.litellm import _usage_of

    anthropic = LiteLLMUsage(
        prompt_tokens=1_000,
        completion_tokens=50,
        cache_read_input_tokens=300,
        cache_creation_input_tokens=200,
    )
    u = _usage_of(anthropic)
    assert u is not None
    assert (u.prompt_tokens, u.cached_prompt_tokens, u.cache_write_prompt_tokens) == (1_000, 300, 200)
    openai = LiteLLMUsage(prompt_tokens=100, completion_tokens=80, reasoning_tokens=60)
    u = _usage_of(openai)
    assert u is not None and (u.completion_tokens, u.reasoning_tokens) == (80, 60)
    # As LiteLLM maps an Anthropic answer: the TTLs in prompt_tokens_details.
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig

    mapped = AnthropicConfig().calculate_usage(
        {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 30,
         "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}, "output_tokens": 3},
        reasoning_content=None,
    )
    u = _usage_of(mapped)
    assert u is not None
    assert (u.prompt_tokens, u.cached_prompt_tokens) == (45, 5)
    assert (u.cache_write_prompt_tokens, u.cache_write_1h_prompt_tokens) == (10, 20)
    # Anthropic's own shape, the TTLs apart.
    native = {"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 30,
              "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}, "output_tokens": 3}
    u = _usage_of(native)
    assert u is not None
    assert (u.prompt_tokens, u.cache_write_prompt_tokens, u.cache_write_1h_prompt_tokens) == (45, 10, 20)
