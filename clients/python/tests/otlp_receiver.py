"""An OTLP trace receiver for the tests: the collector's own messages
(``opentelemetry-proto``), served over gRPC (grpcio) or over HTTP
(``POST /v1/traces``, protobuf bodies). It keeps every span it is sent."""

from __future__ import annotations

import http.server
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from conftest import free_port


@dataclass
class Span:
    """One span as received: ids in hex, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    status_code: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]
    service: str
    scope: str = field(default="")


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Spans:
    """What a receiver was sent, and a way to wait for a span."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._cond = threading.Condition()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._cond:
            self.requests += 1
            for rs in request.resource_spans:
                service = _attributes(rs.resource.attributes).get("service.name", "")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append(Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            status_code=s.status.code,
                            attributes=_attributes(s.attributes),
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            service=service,
                            scope=ss.scope.name,
                        ))
            self._cond.notify_all()

    def wait_for(self, match: Callable[[Span], bool], timeout: float = 15.0) -> Span:
        """The first span ``match`` accepts, waiting up to ``timeout``."""
        deadline = time.time() + timeout
        with self._cond:
            while True:
                for s in self.spans:
                    if match(s):
                        return s
                left = deadline - time.time()
                if left <= 0:
                    names = [(s.name, s.trace_id) for s in self.spans]
                    raise AssertionError(f"no such span within {timeout} s; received {names}")
                self._cond.wait(left)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, spans: Spans) -> None:
        self.spans = spans

    def Export(self, request, context):  # noqa: N802 - the service's method name
        self.spans.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcReceiver(Spans):
    """OTLP over gRPC on a free port (``endpoint``: where to point a service)."""

    def __init__(self) -> None:
        super().__init__()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


class HttpReceiver(Spans):
    """OTLP over HTTP (protobuf bodies on ``POST /v1/traces``) on a free port."""

    def __init__(self) -> None:
        super().__init__()
        spans = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                spans.add(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
