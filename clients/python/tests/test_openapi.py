"""``/openapi.json``: what the service serves is the committed
docs/openapi.json (regenerate it with ``ctxbudget openapi > docs/openapi.json``),
and every path and method it describes is a route the service serves — none
falls through to the "no route" answer or is refused as a wrong method — while
a path it does not describe does."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import REPO, Service

CONFIG = """
[tiers.t]
max_context_tokens = 1000
default_max_output_tokens = 10
tenant = {}
user = {}

[auth]
tokens = [{ name = "ops", token = "openapi-admin-token-01", role = "admin" }]
"""
ADMIN = {"authorization": "Bearer openapi-admin-token-01"}

SAMPLES = {"name": "t", "tenant": "acme"}
QUERY = {"tenant": "acme", "from": "2026-12-01", "to": "2026-12-02", "tier": "t"}


@pytest.fixture(scope="module")
def service():
    s = Service(CONFIG, http=True)
    yield s
    s.stop()


def test_the_served_document_is_the_committed_one(service):
    served = httpx.get(f"{service.http_url}/openapi.json").json()
    committed = json.loads((REPO / "docs" / "openapi.json").read_text())
    assert served == committed, "docs/openapi.json is stale: ctxbudget openapi > docs/openapi.json"
    assert served["openapi"].startswith("3.1")


def test_every_described_route_is_served(service):
    doc = httpx.get(f"{service.http_url}/openapi.json").json()
    checked = 0
    with httpx.Client(base_url=service.http_url, headers=ADMIN, timeout=30, follow_redirects=False) as c:
        for path, methods in doc["paths"].items():
            concrete = path
            for name, value in SAMPLES.items():
                concrete = concrete.replace("{" + name + "}", value)
            assert "{" not in concrete, path
            for method, op in methods.items():
                params = {p["name"]: QUERY.get(p["name"], "x") for p in op.get("parameters", [])
                          if p["in"] == "query" and p.get("required")}
                r = c.request(method.upper(), concrete, params=params, content=b"{}" if method in ("post", "put") else None)
                assert r.status_code != 405, f"{method.upper()} {path}: {r.status_code}"
                if r.status_code == 404:
                    assert "no route" not in r.text, f"{method.upper()} {path} is described but not served"
                for code in map(str, [r.status_code]):
                    assert code in op["responses"] or code.startswith("2"), \
                        f"{method.upper()} {path} answered {code}, which the document does not list: {r.text[:200]}"
                checked += 1
    assert checked >= 40


def test_a_route_it_does_not_describe_is_not_served(service):
    for path in ("/v1/reserve", "/admin/v1/tier", "/admin/v2/tiers", "/console/secret.js"):
        r = httpx.get(f"{service.http_url}{path}", headers=ADMIN)
        assert r.status_code == 404 and "no route" in r.text, path
