"""The HTTP/JSON API (``POST /v1/<rpc>``) with ``httpx``, as a gateway that
speaks only HTTP calls it, on every store (memory, Redis, a Redis Cluster):
every RPC in protobuf's JSON mapping (checked by protobuf's own parser, and
against the same call over gRPC), denials as 429/413 with the headers of
docs/http.md, bearer tokens and tenant bindings as on gRPC, and bodies that
are too large or malformed refused with nothing changed."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from google.protobuf import json_format

from conftest import RedisCluster, Redis, Service
from ctxbudget import pb
from ctxbudget.v1 import budget_pb2_grpc

CONFIG = """
[server]
listen = "127.0.0.1:0"
max_message_bytes = 4096

[reservations]
default_lease_ttl_ms = 60000
max_lease_ttl_ms = 600000
retry_jitter_ms = 0

[tiers.t]
max_context_tokens = 2000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000000, period = "30d" }] }
user = { requests = [{ limit = 3, period = "30d" }], tokens = [{ limit = 100000, period = "30d" }], concurrency = 5 }

[auth]
tokens = [
  { name = "gateway", token = "http-token-for-every-tenant" },
  { name = "acme-only", token = "http-token-bound-to-acme-1", tenants = ["acme"] },
]
"""
TOKEN = "http-token-for-every-tenant"
ACME = "http-token-bound-to-acme-1"


@pytest.fixture(scope="module", params=["memory", "redis", "cluster"])
def service(request):
    store = None
    if request.param == "redis":
        store = Redis()
        s = Service(CONFIG, redis_url=store.url, http=True)
    elif request.param == "cluster":
        store = RedisCluster()
        s = Service(CONFIG, cluster_nodes=store.nodes, http=True)
    else:
        s = Service(CONFIG, http=True)
    yield s
    s.stop()
    if store is not None:
        store.stop()


@pytest.fixture()
def http(service):
    with httpx.Client(base_url=service.http_url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        yield c


def reserve_body(user: str, **extra) -> dict:
    body = {"tenantId": "acme", "userId": user, "tier": "t", "model": "gpt-4o", "promptTokens": "100",
            "maxOutputTokens": 50}
    body.update(extra)
    return body


def parse(message, text: str):
    """``text`` read by protobuf's own JSON parser: it must be the mapping."""
    return json_format.Parse(text, message)


def status_of(http: httpx.Client, user: str) -> dict:
    r = http.post("/v1/get-status", json={"tenant_id": "acme", "user_id": user, "tier": "t"})
    assert r.status_code == 200, r.text
    return r.json()


def remaining(status: dict) -> dict:
    """What is left per level and dimension (not when it resets: that moves)."""
    return {(l["level"], l["dimension"], l["periodSeconds"]): l["remaining"] for l in status["limits"]}


def test_every_rpc_in_protobuf_json(service, http):
    r = http.post("/v1/check-and-reserve", json=reserve_body("every"))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    # The mapping: lowerCamelCase names, enums as names, 64-bit integers as strings.
    assert body["allowed"] is True
    assert body["reservedTokens"] == "150"
    assert body["reason"] == "REASON_UNSPECIFIED"
    assert any(l["level"] == "LEVEL_USER" and l["dimension"] == "DIMENSION_REQUESTS" for l in body["limits"])
    reserved = parse(pb.CheckAndReserveResponse(), r.text)
    assert reserved.reserved_tokens == 150 and reserved.granted_max_output_tokens == 50
    assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert r.headers["x-ratelimit-remaining-requests"] == "2"

    # The proto's own field names are accepted too.
    renewed = http.post("/v1/renew-lease", json={"reservation_id": reserved.reservation_id, "lease_ttl_ms": 30000})
    assert renewed.status_code == 200, renewed.text
    assert parse(pb.RenewLeaseResponse(), renewed.text).outcome == pb.OUTCOME_APPLIED

    committed = http.post("/v1/commit", json={"reservationId": reserved.reservation_id, "promptTokens": "90",
                                              "completionTokens": 40})
    assert committed.status_code == 200, committed.text
    commit = parse(pb.CommitResponse(), committed.text)
    assert commit.outcome == pb.OUTCOME_APPLIED
    assert commit.token_delta == -20, "150 reserved, 130 used"
    assert committed.json()["tokenDelta"] == "-20"

    again = http.post("/v1/commit", json={"reservationId": reserved.reservation_id, "promptTokens": "90"})
    assert parse(pb.CommitResponse(), again.text).outcome == pb.OUTCOME_ALREADY_SETTLED

    second = parse(pb.CheckAndReserveResponse(), http.post("/v1/check-and-reserve", json=reserve_body("every")).text)
    refunded = http.post("/v1/refund", json={"reservationId": second.reservation_id})
    assert refunded.status_code == 200, refunded.text
    assert parse(pb.RefundResponse(), refunded.text).refunded_tokens == 150

    estimator = http.post("/v1/get-estimator", content=b"")
    assert estimator.status_code == 200, estimator.text
    parse(pb.GetEstimatorResponse(), estimator.text)

    # GetStatus says over HTTP what it says over gRPC: one service, one truth.
    over_http = parse(pb.GetStatusResponse(), http.post(
        "/v1/get-status", json={"tenantId": "acme", "userId": "every", "tier": "t"}).text)
    with grpc.insecure_channel(service.target) as channel:
        stub = budget_pb2_grpc.BudgetServiceStub(channel)
        over_grpc = stub.GetStatus(pb.GetStatusRequest(tenant_id="acme", user_id="every", tier="t"),
                                   metadata=[("authorization", f"Bearer {TOKEN}")])
    left = lambda s: {(l.level, l.dimension, l.period_seconds): l.remaining for l in s.limits}  # noqa: E731
    assert left(over_http) == left(over_grpc)
    assert left(over_http)[(pb.LEVEL_USER, pb.DIMENSION_TOKENS, 30 * 86400)] == 100000 - 130


def test_denials_are_429_and_413_with_the_headers(http):
    for _ in range(3):
        ok = http.post("/v1/check-and-reserve", json=reserve_body("denied"))
        assert ok.status_code == 200, ok.text
    denied = http.post("/v1/check-and-reserve", json=reserve_body("denied"))
    assert denied.status_code == 429, denied.text
    body = denied.json()
    assert body["allowed"] is False
    assert body["reason"] == "REASON_RPM_EXCEEDED"
    assert body["limitingLevel"] == "LEVEL_USER"
    assert int(denied.headers["retry-after"]) >= 1
    assert int(denied.headers["retry-after"]) == -(-int(body["retryAfterMs"]) // 1000)
    assert denied.headers["x-ratelimit-remaining-requests"] == "0"

    too_large = http.post("/v1/check-and-reserve", json=reserve_body("large", promptTokens="5000"))
    assert too_large.status_code == 413, too_large.text
    assert too_large.json()["reason"] == "REASON_CONTEXT_TOO_LARGE"
    assert "retry-after" not in too_large.headers


def test_tokens_and_tenant_bindings_as_on_grpc(service, http):
    url = service.http_url
    missing = httpx.post(f"{url}/v1/check-and-reserve", json=reserve_body("auth"))
    assert missing.status_code == 401, missing.text
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["status"] == "UNAUTHENTICATED"
    wrong = httpx.post(f"{url}/v1/check-and-reserve", json=reserve_body("auth"),
                       headers={"authorization": "Bearer not-a-configured-token"})
    assert wrong.status_code == 401
    assert "not-a-configured-token" not in wrong.text

    bound = {"authorization": f"Bearer {ACME}"}
    assert httpx.post(f"{url}/v1/check-and-reserve", json=reserve_body("auth"), headers=bound).status_code == 200
    other = httpx.post(f"{url}/v1/check-and-reserve", json=reserve_body("auth", tenantId="globex"), headers=bound)
    assert other.status_code == 403, other.text
    assert other.json()["error"]["status"] == "PERMISSION_DENIED"

    # Settling another tenant's reservation is refused too.
    theirs = parse(pb.CheckAndReserveResponse(),
                   http.post("/v1/check-and-reserve", json=reserve_body("auth", tenantId="globex")).text)
    refused = httpx.post(f"{url}/v1/refund", json={"reservationId": theirs.reservation_id}, headers=bound)
    assert refused.status_code == 403
    assert http.post("/v1/refund", json={"reservationId": theirs.reservation_id}).json()["outcome"] == \
        "OUTCOME_APPLIED", "the refused refund left the reservation in place"


@pytest.mark.parametrize("body, status, words", [
    (b"{" + b" " * 8000 + b"}", 413, "max_message_bytes"),
    (b'{"tenantId": "acme", "userId": ', 400, "protobuf's JSON mapping"),
    (b"tenantId=acme&userId=x", 400, "protobuf's JSON mapping"),
    (json.dumps(reserve_body("bad", bogus=1)).encode(), 400, "unknown field `bogus`"),
    (json.dumps(reserve_body("bad", promptTokens="many")).encode(), 400, "protobuf's JSON mapping"),
    (json.dumps(reserve_body("bad", priority="PRIORITY_URGENT")).encode(), 400, "PRIORITY_URGENT"),
    (json.dumps(reserve_body("bad", tier="nope")).encode(), 400, "nope"),
])
def test_bad_bodies_are_refused_and_change_nothing(http, body, status, words):
    before = remaining(status_of(http, "bad"))
    r = http.post("/v1/check-and-reserve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status
    assert words in error["message"], error["message"]
    assert remaining(status_of(http, "bad")) == before


def test_unknown_routes_and_methods_say_what_exists(http):
    missing = http.post("/v1/reserve", json={})
    assert missing.status_code == 404
    assert "/v1/check-and-reserve" in missing.json()["error"]["message"]
    get = http.get("/v1/commit")
    assert get.status_code == 405
    assert "POST" in get.json()["error"]["message"]


def test_a_client_that_never_finishes_its_headers_is_let_go():
    import socket

    s = Service(CONFIG, http=True)
    try:
        host, port = s.http_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as slow:
            slow.sendall(b"POST /v1/get-estimator HTTP/1.1\r\nHost: x\r\n")
            slow.settimeout(60)
            assert slow.recv(1000) == b"", "the server closed the connection"
        assert httpx.post(f"{s.http_url}/v1/get-estimator", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    finally:
        s.stop()
