"""ctxbudget as Envoy's rate limit service, through a real Envoy 1.40 started
on the bootstrap docs/envoy.md shows (addresses, ports and the token
substituted), with the Lua filter it shows for plain Envoy inserted before
the rate limit filter, in front of the TLS mock upstream: the request path
counts requests and answers Envoy's 429 (an empty body, with ctxbudget's
headers) past the limit; the response path charges the tokens the answer
reports; an unknown tier and ctxbudget down are Envoy's empty 503."""

from __future__ import annotations


import httpx
import pytest

from conftest import Service, free_port
from ctxbudget import BudgetClient, pb
from envoy_proxy import Envoy, TlsUpstream, docs_bootstrap, docs_yaml_block, substitute, wait_for

TOKEN = "envoy-rls-token-0123456789"

CONFIG = f"""
[reservations]
retry_jitter_ms = 0

[[auth.tokens]]
name = "envoy"
token = "{TOKEN}"

[envoy]
default_tier = "free"

[tiers.free]
max_context_tokens = 8000
default_max_output_tokens = 50
user = {{ requests = [{{ limit = 3, period = "1h" }}], tokens = [{{ limit = 100000, period = "1d" }}] }}
"""

MESSAGES = [{"role": "user", "content": "Say something short about budgets, please."}]
RATELIMIT_FILTER = "          - name: envoy.filters.http.ratelimit\n"


def with_lua(bootstrap: str) -> str:
    """The docs' bootstrap with the docs' Lua filter first in ``http_filters``
    (the filter list sits at ten spaces in the bootstrap)."""
    lua = docs_yaml_block("envoy.md", "envoy.filters.http.lua")
    indented = "".join("          " + line if line.strip() else line for line in lua.splitlines(keepends=True))
    assert bootstrap.count(RATELIMIT_FILTER) == 1
    return bootstrap.replace(RATELIMIT_FILTER, indented + RATELIMIT_FILTER)


@pytest.fixture(scope="module")
def stack():
    port = free_port()
    service = Service(CONFIG, port=port)
    upstream = TlsUpstream()
    admin, listen = free_port(), free_port()
    bootstrap = substitute(docs_bootstrap("envoy.md"), admin=admin, listen=listen, ctxbudget=port,
                           upstream=upstream.port, token=TOKEN)
    envoy = Envoy(with_lua(bootstrap), admin, listen)
    yield service, upstream, envoy
    envoy.stop()
    upstream.stop()
    service.stop()


def user_left(service: Service, user: str, dimension: int) -> int:
    with BudgetClient(service.target, token=TOKEN) as c:
        s = c.get_status("acme", "free", user=user)
    return next(l.remaining for l in s.limits if l.level == pb.LEVEL_USER and l.dimension == dimension)


def chat(envoy: Envoy, user: str, tier: str | None = None, stream: bool = False) -> httpx.Response:
    headers = {"x-tenant-id": "acme", "x-user-id": user}
    if tier:
        headers["x-tier"] = tier
    body = {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 20}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return httpx.post(envoy.url + "/v1/chat/completions", headers=headers, json=body, timeout=10)


def test_requests_are_counted_and_the_answers_tokens_charged(stack):
    service, upstream, envoy = stack
    tokens = user_left(service, "alice", pb.DIMENSION_TOKENS)
    r = chat(envoy, "alice")
    assert r.status_code == 200, r.text
    total = r.json()["usage"]["total_tokens"]
    # ctxbudget's headers on the upstream's answer: the caller's budget.
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "2"
    assert user_left(service, "alice", pb.DIMENSION_REQUESTS) == 2
    # The response path charged the tokens the answer reported (less what
    # a day's rate of 100,000 refills meanwhile: about one a second).
    assert wait_for(lambda: tokens - user_left(service, "alice", pb.DIMENSION_TOKENS) >= total - 2), (
        tokens, user_left(service, "alice", pb.DIMENSION_TOKENS), total)
    assert tokens - user_left(service, "alice", pb.DIMENSION_TOKENS) <= total
    # A stream's usage, from its last event.
    tokens = user_left(service, "alice", pb.DIMENSION_TOKENS)
    r = chat(envoy, "alice", stream=True)
    assert r.status_code == 200
    streamed = next(
        int(line.split('"total_tokens": ')[1].split(",")[0].split("}")[0])
        for line in r.text.splitlines() if '"total_tokens"' in line
    )
    assert wait_for(lambda: tokens - user_left(service, "alice", pb.DIMENSION_TOKENS) >= streamed - 2)


def test_past_the_limit_envoy_answers_its_429_with_ctxbudgets_headers(stack):
    service, upstream, envoy = stack
    for _ in range(3):
        assert chat(envoy, "bob").status_code == 200
    before = upstream.get("/stats")["requests"]
    r = chat(envoy, "bob")
    assert r.status_code == 429
    # Envoy's own 429: an empty body (the external processor answers JSON).
    assert r.content == b"", r.text
    assert r.headers["x-envoy-ratelimited"] == "true"
    assert int(r.headers["retry-after"]) > 0
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert upstream.get("/stats")["requests"] == before, "nothing went upstream"


def test_an_unknown_tier_and_ctxbudget_down_are_envoys_empty_503(stack):
    service, upstream, envoy = stack
    r = chat(envoy, "carol", tier="no-such-tier")
    assert (r.status_code, r.content) == (503, b""), r.text
    service.stop()
    r = chat(envoy, "carol")
    assert (r.status_code, r.content) == (503, b""), r.text
