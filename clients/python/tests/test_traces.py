"""Traces: a service pointed at an OTLP receiver (``[telemetry]
otlp_endpoint``) exports one span per operation, a child of the trace the
caller sent (W3C ``traceparent`` in gRPC metadata, HTTP headers, the
Envoy rate limit call's metadata), with the decision on it; a Commit links
to its reservation's span; the Python client passes the application's
current span; OTLP over HTTP works as over gRPC; and a collector that is
down costs the decisions nothing and loses none (its spans are counted as
dropped)."""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.request

import grpc
import pytest

from conftest import Service, free_port
from ctxbudget import BudgetClient, pb
from ctxbudget.v1 import budget_pb2_grpc as rpc
from otlp_receiver import GrpcReceiver, HttpReceiver, Span

CONFIG = """
[reservations]
retry_jitter_ms = 0

[envoy]
default_tier = "free"

[telemetry]
otlp_endpoint = "{endpoint}"
otlp_protocol = "{protocol}"
service_name = "budget-under-test"
export_timeout_ms = {timeout}

[tiers.free]
max_context_tokens = 100000
default_max_output_tokens = 50
user = {{ requests = [{{ limit = 3, period = "1h" }}] }}
"""


def config(endpoint: str, protocol: str = "grpc", timeout: int = 10000) -> str:
    return CONFIG.format(endpoint=endpoint, protocol=protocol, timeout=timeout)


def traceparent() -> tuple[str, str, str]:
    """A fresh sampled W3C trace context: the header, its trace id, its span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def reserve(user: str, tier: str = "free") -> pb.CheckAndReserveRequest:
    return pb.CheckAndReserveRequest(tenant_id="acme", user_id=user, tier=tier, model="gpt-4o-mini",
                                     prompt_tokens=20, max_output_tokens=10)


@pytest.fixture(scope="module")
def traced():
    receiver = GrpcReceiver()
    service = Service(config(receiver.endpoint), http=True)
    channel = grpc.insecure_channel(service.target)
    yield receiver, service, rpc.BudgetServiceStub(channel)
    channel.close()
    service.stop()
    receiver.stop()


def child_of(trace_id: str, parent: str, name: str):
    return lambda s: s.trace_id == trace_id and s.parent_span_id == parent and s.name == name


def test_a_decision_is_a_child_of_the_callers_trace_with_its_outcome(traced):
    receiver, _, stub = traced
    header, trace_id, parent = traceparent()
    r = stub.CheckAndReserve(reserve("alice"), metadata=(("traceparent", header),))
    assert r.allowed
    span = receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve"))
    a = span.attributes
    assert span.service == "budget-under-test"
    assert span.kind == 2, "a server span"
    assert a["ctxbudget.tenant"] == "acme" and a["ctxbudget.tier"] == "free"
    assert a["ctxbudget.decision"] == "allowed"
    assert a["ctxbudget.reserved_tokens"] == r.reserved_tokens
    assert a["ctxbudget.degraded"] is False and a["ctxbudget.waited_ms"] == 0
    assert a["ctxbudget.store_ms"] >= 0 and a["ctxbudget.reservation"] == r.reservation_id

    # The Commit, in a trace of its own, links to the reservation's span.
    header, commit_trace, commit_parent = traceparent()
    stub.Commit(pb.CommitRequest(reservation_id=r.reservation_id, prompt_tokens=20, completion_tokens=5),
                metadata=(("traceparent", header),))
    commit = receiver.wait_for(child_of(commit_trace, commit_parent, "Commit"))
    assert (span.trace_id, span.span_id) in commit.links
    assert commit.attributes["ctxbudget.tenant"] == "acme"


def test_a_denial_carries_its_reason_and_level(traced):
    receiver, _, stub = traced
    for _ in range(3):
        assert stub.CheckAndReserve(reserve("bob")).allowed
    header, trace_id, parent = traceparent()
    r = stub.CheckAndReserve(reserve("bob"), metadata=(("traceparent", header),))
    assert not r.allowed
    a = receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve")).attributes
    assert a["ctxbudget.decision"] == "denied"
    assert a["ctxbudget.reason"] == "rpm_exceeded"
    assert a["ctxbudget.level"] == "user"
    assert a["ctxbudget.retry_after_ms"] > 0


def test_an_error_marks_its_span_failed(traced):
    receiver, _, stub = traced
    header, trace_id, parent = traceparent()
    with pytest.raises(grpc.RpcError) as e:
        stub.CheckAndReserve(reserve("carol", tier="no-such-tier"), metadata=(("traceparent", header),))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    span = receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve"))
    assert span.status_code == 2, "STATUS_CODE_ERROR"


def test_the_http_api_joins_the_callers_trace(traced):
    receiver, service, _ = traced
    header, trace_id, parent = traceparent()
    body = {"tenantId": "acme", "userId": "dave", "tier": "free", "model": "gpt-4o-mini", "promptTokens": 20}
    req = urllib.request.Request(f"{service.http_url}/v1/check-and-reserve", json.dumps(body).encode(),
                                 {"content-type": "application/json", "traceparent": header})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read())["allowed"]
    span = receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve"))
    assert span.attributes["ctxbudget.tenant"] == "acme"


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (the RLS request is three of them)."""
    n, out = len(payload), b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return bytes([number << 3 | 2]) + out + payload


def test_the_rate_limit_service_joins_envoys_trace(traced):
    receiver, service, _ = traced
    # RateLimitRequest{domain, descriptors: [{entries: [tenant=acme, user=erin]}]}, as Envoy
    # sends it, with the metadata Envoy's tracer adds to the call.
    entry = lambda k, v: _field(1, _field(1, k.encode()) + _field(2, v.encode()))  # noqa: E731
    request = _field(1, b"llm") + _field(2, entry("tenant", "acme") + entry("user", "erin"))
    header, trace_id, parent = traceparent()
    with grpc.insecure_channel(service.target) as channel:
        call = channel.unary_unary("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        answer = call(request, metadata=(("traceparent", header),), timeout=10)
    assert answer, "an answer"
    span = receiver.wait_for(child_of(trace_id, parent, "ShouldRateLimit"))
    assert span.kind == 2
    assert span.attributes["ctxbudget.tenant"] == "acme" and span.attributes["ctxbudget.tier"] == "free"
    assert span.attributes["ctxbudget.decision"] == "allowed"


def test_the_python_client_passes_the_applications_current_span(traced):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    receiver, service, _ = traced
    tracer = TracerProvider().get_tracer("gateway")
    with BudgetClient(service.target) as client, tracer.start_as_current_span("llm call") as span:
        r = client.check_and_reserve(tenant="acme", user="frank", tier="free", model="gpt-4o-mini", prompt_tokens=20)
        ctx = span.get_span_context()
    assert r.allowed
    trace_id, parent = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
    receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve"))
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_otlp_over_http_exports_the_same_spans():
    receiver = HttpReceiver()
    service = Service(config(receiver.endpoint, protocol="http/protobuf"))
    try:
        with grpc.insecure_channel(service.target) as channel:
            header, trace_id, parent = traceparent()
            r = rpc.BudgetServiceStub(channel).CheckAndReserve(reserve("gina"), metadata=(("traceparent", header),))
            assert r.allowed
        span = receiver.wait_for(child_of(trace_id, parent, "CheckAndReserve"))
        assert span.attributes["ctxbudget.decision"] == "allowed"
    finally:
        service.stop()
        receiver.stop()


def metric(url: str, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)"
    m = re.search("^" + pattern + "$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_collector_that_is_down_costs_decisions_nothing_and_is_counted():
    # Nothing listens at the endpoint: every export fails.
    metrics_port = free_port()
    service = Service(config(f"http://127.0.0.1:{free_port()}", timeout=500),
                      extra_args=["--metrics-listen", f"127.0.0.1:{metrics_port}"])
    url = f"http://127.0.0.1:{metrics_port}"
    try:
        with grpc.insecure_channel(service.target) as channel:
            stub = rpc.BudgetServiceStub(channel)
            for i in range(200):
                header, _, _ = traceparent()
                r = stub.CheckAndReserve(reserve(f"user-{i}"), metadata=(("traceparent", header),), timeout=5)
                assert r.allowed, "no decision is lost"
        deadline = time.time() + 15
        while metric(url, "ctxbudget_trace_spans_dropped_total", 'reason="export_failed"') < 200:
            assert time.time() < deadline, "the spans that could not be sent are counted"
            time.sleep(0.2)
        assert metric(url, "ctxbudget_trace_spans_exported_total") == 0
    finally:
        service.stop()


def test_off_without_an_endpoint():
    service = Service(config("").replace('otlp_endpoint = ""\n', ""), env={
        k: "" for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    })
    try:
        with BudgetClient(service.target) as client:
            assert client.check_and_reserve(tenant="acme", user="hal", tier="free", prompt_tokens=20).allowed
    finally:
        service.stop()
    log = open(service.log.name).read()
    assert "exporting traces" not in log, log
