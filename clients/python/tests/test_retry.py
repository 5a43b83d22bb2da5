"""The retry helper against a real local HTTP server: which statuses and
errors it retries, Retry-After, full jitter capped, one idempotency key."""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading

import httpx
import pytest

from ctxbudget import RetryPolicy, retry, retry_async
from conftest import free_port


class Upstream:
    """Answers the statuses in ``script`` in turn (then 200), recording each
    request's Idempotency-Key."""

    def __init__(self, script):
        self.script = list(script)
        self.keys: list[str] = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                outer.keys.append(self.headers.get("Idempotency-Key", ""))
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat/completions"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def post(url):
    return lambda key: httpx.post(url, headers={"Idempotency-Key": key})


def test_retryable_statuses_are_retried_with_one_key_and_retry_after_honoured():
    up = Upstream([(429, {"Retry-After": "1"}), (503, {}), (529, {})])
    waits: list[float] = []
    r = retry(post(up.url), policy=RetryPolicy(max_attempts=5, base_delay=0.01, max_delay=0.05), sleep=waits.append)
    assert r.status_code == 200
    assert len(up.keys) == 4 and len(set(up.keys)) == 1, "the same idempotency key every attempt"
    assert waits[0] >= 1.0, "Retry-After: 1 honoured"
    assert all(w <= 0.05 for w in waits[1:]), "full jitter, capped at max_delay"
    up.close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_never_retried(status):
    up = Upstream([(status, {})])
    r = retry(post(up.url), sleep=lambda s: pytest.fail("no retry"))
    assert r.status_code == status and len(up.keys) == 1
    up.close()


def test_attempts_run_out_and_the_last_answer_is_returned():
    up = Upstream([(500, {})] * 10)
    r = retry(post(up.url), policy=RetryPolicy(max_attempts=3, base_delay=0.001), sleep=lambda s: None)
    assert r.status_code == 500 and len(up.keys) == 3
    up.close()


def test_a_retry_after_beyond_the_cap_is_returned_at_once():
    up = Upstream([(429, {"Retry-After": "3600"})])
    r = retry(post(up.url), sleep=lambda s: pytest.fail("no wait of an hour"))
    assert r.status_code == 429
    up.close()


def test_connection_errors_are_retried_async():
    port = free_port()  # nothing listens: connection refused
    calls = []

    async def call(key):
        calls.append(key)
        async with httpx.AsyncClient() as c:
            return await c.post(f"http://127.0.0.1:{port}/")

    async def no_sleep(s):
        pass

    with pytest.raises(httpx.ConnectError):
        asyncio.run(retry_async(call, policy=RetryPolicy(max_attempts=3), sleep=no_sleep))
    assert len(calls) == 3 and len(set(calls)) == 1


class Parsed:
    """A parsed SDK result: no status, no headers."""


def test_a_result_without_a_status_is_a_success_and_is_not_sent_again():
    calls = []
    out = retry(lambda key: calls.append(key) or Parsed(), sleep=lambda s: pytest.fail("no retry"))
    assert isinstance(out, Parsed) and len(calls) == 1


def test_retry_after_as_an_http_date_or_unreadable():
    up = Upstream([(503, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), (503, {"Retry-After": "soon"})])
    waits: list[float] = []
    r = retry(post(up.url), policy=RetryPolicy(base_delay=0.01, max_delay=0.02), sleep=waits.append)
    assert r.status_code == 200 and len(waits) == 2, "a past date and an unreadable value fall back to the backoff"
    assert all(w <= 0.02 for w in waits)
    up.close()


def test_an_exception_carrying_a_retryable_status_is_retried():
    up = Upstream([(502, {}), (404, {})])

    def call(key):
        r = httpx.post(up.url)
        r.raise_for_status()
        return r

    with pytest.raises(httpx.HTTPStatusError) as e:
        retry(call, policy=RetryPolicy(base_delay=0.001), sleep=lambda s: None)
    assert e.value.response.status_code == 404 and len(up.keys) == 2, "502 retried, 404 not"
    up.close()
