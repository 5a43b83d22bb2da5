"""The admin API (``/admin/v1/…``) with ``httpx``, as a portal or a billing
system uses it, on two replicas sharing a Redis: each document kind's verbs
(list, get, set, delete, history), a stale ``If-Match`` refused 412 with
nothing changed, caller tokens refused 403, every write audited with who made
it and applied by the other replica, and the ledger for finance (usage as
JSON and CSV, a provider export reconciled with one drifted row). On the
in-memory store the ledger answers, the configuration in force is read (the
console's Quotas page) and a write says where the configuration lives."""

from __future__ import annotations

import csv
import datetime
import io
import signal
import time

import httpx
import pytest

from conftest import Redis, Service

CONFIG = """
[reservations]
retry_jitter_ms = 0

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000000, period = "1d" }] }
user = { requests = [{ limit = 100, period = "1d" }] }

[auth]
tokens = [
  { name = "ops", token = "admin-token-for-the-tests", role = "admin" },
  { name = "gateway", token = "caller-token-for-the-tests" },
]
"""
ADMIN = {"authorization": "Bearer admin-token-for-the-tests"}
CALLER = {"authorization": "Bearer caller-token-for-the-tests"}

TIER = {
    "max_context_tokens": 8000,
    "default_max_output_tokens": 200,
    "tenant": {"requests": [{"limit": 500, "period": "1m"}]},
    "user": {"requests": [{"limit": 7, "period": "1m"}]},
}


@pytest.fixture(scope="module")
def replicas():
    redis = Redis()
    a = Service(CONFIG, redis_url=redis.url, http=True)
    b = Service(CONFIG, redis_url=redis.url, http=True)
    yield a, b
    a.stop()
    b.stop()
    redis.stop()


@pytest.fixture()
def a(replicas):
    with httpx.Client(base_url=replicas[0].http_url, headers=ADMIN, timeout=30) as c:
        yield c


@pytest.fixture()
def b(replicas):
    with httpx.Client(base_url=replicas[1].http_url, headers=ADMIN, timeout=30) as c:
        yield c


def etag(r: httpx.Response) -> str:
    tag = r.headers["etag"]
    assert tag.startswith('"') and tag.endswith('"'), tag
    return tag


def reserve(client: httpx.Client, tier: str, user: str = "u", tenant: str = "acme") -> httpx.Response:
    return client.post("/v1/check-and-reserve", headers=CALLER, json={
        "tenantId": tenant, "userId": user, "tier": tier, "model": "gpt-4o", "promptTokens": 10,
        "maxOutputTokens": 10})


def wait_applied(client: httpx.Client, tier: str, want: str) -> float:
    """Seconds until `client`'s replica answers with the tier's new user limit."""
    started = time.monotonic()
    while True:
        r = reserve(client, tier, user=f"probe-{time.monotonic_ns()}")
        if r.status_code == 200 and r.headers.get("x-ratelimit-limit-requests") == want:
            return time.monotonic() - started
        assert time.monotonic() - started < 5, (r.status_code, r.text[:300])
        time.sleep(0.02)


def test_a_tier_is_created_read_changed_and_deleted_on_both_replicas(a, b):
    created = a.put("/admin/v1/tiers/gold", json=TIER)
    assert created.status_code == 201, created.text
    assert created.json()["old"] is None and created.json()["new"]["user"]["requests"][0]["limit"] == 7
    # The other replica applies it (Redis's change notice), within a second in practice.
    wait_applied(b, "gold", "7")

    got = b.get("/admin/v1/tiers/gold")
    assert got.status_code == 200
    assert got.json() == TIER
    tag = etag(got)

    changed = dict(TIER, user={"requests": [{"limit": 3, "period": "1m"}]})
    updated = b.put("/admin/v1/tiers/gold", json=changed, headers={"if-match": tag})
    assert updated.status_code == 200, updated.text
    assert updated.json()["old"]["user"]["requests"][0]["limit"] == 7
    wait_applied(a, "gold", "3")

    listed = a.get("/admin/v1/tiers", params={"search": "GOL"})
    assert listed.status_code == 200
    assert [i["name"] for i in listed.json()["items"]] == ["gold"]
    assert listed.json()["total"] == 1

    history = a.get("/admin/v1/tiers/gold/history").json()
    assert [h["what"] for h in history] == ["updated", "created"]
    assert all(h["actor"] == "ops (admin API)" for h in history)
    assert any("user.requests" in line for line in history[0]["changes"])

    deleted = a.delete("/admin/v1/tiers/gold")
    assert deleted.status_code == 200 and deleted.json()["new"] is None
    assert a.get("/admin/v1/tiers/gold").status_code == 404
    assert "the tiers are: t" in a.get("/admin/v1/tiers/gold").json()["error"]["message"]


def test_a_stale_version_is_refused_and_changes_nothing(a, b):
    assert a.put("/admin/v1/tiers/silver", json=TIER).status_code == 201
    tag = etag(a.get("/admin/v1/tiers/silver"))
    theirs = dict(TIER, max_context_tokens=9000)
    assert b.put("/admin/v1/tiers/silver", json=theirs, headers={"if-match": tag}).status_code == 200
    mine = dict(TIER, max_context_tokens=4000)
    stale = a.put("/admin/v1/tiers/silver", json=mine, headers={"if-match": tag})
    assert stale.status_code == 412, stale.text
    assert "nothing was written" in stale.json()["error"]["message"]
    assert a.get("/admin/v1/tiers/silver").json()["max_context_tokens"] == 9000
    # A version read after the change is current: the write goes through.
    fresh = etag(a.get("/admin/v1/tiers/silver"))
    written = a.put("/admin/v1/tiers/silver", json=mine, headers={"if-match": fresh})
    assert written.status_code == 200
    assert etag(written) != fresh, "the write answers the new version"
    # Another document changing does not make this one's version stale.
    assert a.put("/admin/v1/tiers/bronze", json=TIER).status_code == 201
    assert a.delete("/admin/v1/tiers/silver", headers={"if-match": etag(written)}).status_code == 200
    assert a.delete("/admin/v1/tiers/bronze").status_code == 200
    assert a.get("/admin/v1/tiers/silver").status_code == 404
    assert a.put("/admin/v1/tiers/silver", json=TIER, headers={"if-match": "soon"}).status_code == 400


def test_caller_tokens_and_bad_documents_are_refused(replicas, a):
    url = replicas[0].http_url
    version = etag(a.get("/admin/v1/tiers"))
    caller = httpx.put(f"{url}/admin/v1/tiers/t", json=TIER, headers=CALLER)
    assert caller.status_code == 403, caller.text
    assert "role" in caller.json()["error"]["message"]
    assert httpx.get(f"{url}/admin/v1/tiers").status_code == 401
    bad = a.put("/admin/v1/tiers/t", json=dict(TIER, user={"requests": [{"limit": 5, "period": "soon"}]}))
    assert bad.status_code == 400
    assert "tiers.t.user.requests" in bad.json()["error"]["message"]
    assert "nothing was written" in bad.json()["error"]["message"]
    unknown = a.put("/admin/v1/tiers/t", json=dict(TIER, burst=3))
    assert unknown.status_code == 400 and "burst" in unknown.json()["error"]["message"]
    assert a.delete("/admin/v1/tiers/nope").status_code == 404
    assert a.get("/admin/v1/nothing").status_code == 404
    assert etag(a.get("/admin/v1/tiers")) == version, "nothing was written"
    # A caller token still reserves: the data plane is not the admin's.
    assert reserve(a, "t").status_code == 200


def test_every_document_kind(a, b):
    group = {"match": ["gpt-4o*"], "global": {"requests": [{"limit": 1000, "period": "1m"}]}}
    assert a.put("/admin/v1/models/gpt-4o", json=group).status_code == 201
    assert b.get("/admin/v1/models/gpt-4o").json()["match"] == ["gpt-4o*"]
    assert a.put("/admin/v1/prices/gpt-4o", json={"input": 2.5, "output": 10}).status_code == 201
    assert b.get("/admin/v1/prices/gpt-4o").json()["output"] == 10

    deal = {"user": {"requests": [{"limit": 2, "period": "1m"}]}, "blocked": "unpaid invoice"}
    assert a.put("/admin/v1/overrides/acme-deal", json=deal).status_code == 201
    shown = b.get("/admin/v1/overrides/acme-deal").json()
    assert shown["blocked"] == "unpaid invoice", "the block is part of the override"
    # A new deal keeps the block; deleting the override keeps it too.
    assert a.put("/admin/v1/overrides/acme-deal", json={"user": {}}).json()["new"]["blocked"] == "unpaid invoice"
    dropped = a.delete("/admin/v1/overrides/acme-deal")
    assert dropped.status_code == 200 and "block stays" in dropped.json()["note"]

    envoy = a.get("/admin/v1/envoy")
    assert envoy.status_code == 200
    assert a.put("/admin/v1/envoy", json=envoy.json()).status_code in (200, 201)
    assert a.delete("/admin/v1/envoy").status_code == 200
    assert a.get("/admin/v1/envoy/history").json()[0]["what"] == "deleted"

    glob = {"requests": [{"limit": 100000, "period": "1m"}]}
    assert a.put("/admin/v1/global", json=glob).status_code in (200, 201)
    assert b.get("/admin/v1/global").json() == glob

    # A group a tier limits cannot go; one no tier limits can.
    assert a.put("/admin/v1/tiers/m", json=dict(TIER, models={"gpt-4o": {"user": {"requests": [{"limit": 5, "period": "1m"}]}}})).status_code == 201
    used = a.delete("/admin/v1/models/gpt-4o")
    assert used.status_code == 400 and "tiers.m.models.gpt-4o" in used.json()["error"]["message"]
    assert a.delete("/admin/v1/tiers/m").status_code == 200
    assert a.delete("/admin/v1/prices/gpt-4o").status_code == 200
    assert a.delete("/admin/v1/models/gpt-4o").status_code == 200

    everything = a.get("/admin/v1/history", params={"limit": 500}).json()
    fields = {h["field"] for h in everything}
    assert {"model:gpt-4o", "price:gpt-4o", "override:acme-deal", "envoy", "global"} <= fields


def hour(line_period: str) -> str:
    return line_period.replace("Z", ":00Z") if line_period.endswith("Z") else line_period


def test_usage_and_reconcile_for_finance(a):
    for i in range(4):
        r = reserve(a, "t", user="finance", tenant="fin")
        assert r.status_code == 200, r.text
        done = a.post("/v1/commit", headers=CALLER, json={"reservationId": r.json()["reservationId"],
                                                          "promptTokens": 100 + i, "completionTokens": 50})
        assert done.status_code == 200, done.text
    today = datetime.datetime.now(datetime.timezone.utc).date()
    window = {"tenant": "fin", "from": str(today), "to": str(today + datetime.timedelta(days=1))}
    usage = a.get("/admin/v1/usage", params=window)
    assert usage.status_code == 200, usage.text
    total = usage.json()["total"]
    assert total["requests"] == 4 and total["prompt_tokens"] == 406 and total["completion_tokens"] == 200

    exported = a.get("/admin/v1/usage", params=dict(window, format="csv"))
    assert exported.headers["content-type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert sum(int(r["requests"]) for r in rows) == 4

    hourly = a.get("/admin/v1/usage", params=dict(window, by="hour")).json()["lines"]
    export = io.StringIO()
    w = csv.writer(export)
    w.writerow(["hour_start", "model", "input_tokens", "output_tokens"])
    for line in hourly:
        w.writerow([hour(line["period"]), "gpt-4o", line["prompt_tokens"], line["completion_tokens"]])
    params = {"from": str(today), "to": str(today + datetime.timedelta(days=1)), "tenant": "fin"}
    clean = a.post("/admin/v1/reconcile", params=params, content=export.getvalue())
    assert clean.status_code == 200, clean.text
    assert clean.json()["flagged"] == 0 and clean.json()["rows"]

    drifted = export.getvalue().splitlines()
    first = drifted[1].split(",")
    first[2] = str(int(first[2]) * 2)
    drifted[1] = ",".join(first)
    flagged = a.post("/admin/v1/reconcile", params=params, content="\n".join(drifted) + "\n").json()
    assert flagged["flagged"] == 1
    assert [r["flagged"] for r in flagged["rows"]].count(True) == 1

    bad = a.post("/admin/v1/reconcile", params=params, content="when,what\n1,2\n")
    assert bad.status_code == 400 and "hour_start" in bad.json()["error"]["message"]
    assert a.get("/admin/v1/usage", params=dict(window, by="week")).status_code == 400


def test_on_the_memory_store_the_ledger_answers_and_the_configuration_says_where_it_lives():
    s = Service(CONFIG, http=True)
    try:
        with httpx.Client(base_url=s.http_url, headers=ADMIN, timeout=30) as c:
            r = reserve(c, "t", tenant="mem")
            assert r.status_code == 200
            assert c.post("/v1/commit", headers=CALLER, json={
                "reservationId": r.json()["reservationId"], "promptTokens": 10}).status_code == 200
            today = datetime.datetime.now(datetime.timezone.utc).date()
            usage = c.get("/admin/v1/usage", params={"tenant": "mem", "from": str(today),
                                                     "to": str(today + datetime.timedelta(days=1))})
            assert usage.status_code == 200, usage.text
            assert usage.json()["total"]["requests"] == 1, usage.text
            # Reads answer the file's configuration in force, versioned by
            # the loads since start.
            listed = c.get("/admin/v1/tiers")
            assert listed.status_code == 200, listed.text
            assert (listed.headers["etag"], listed.json()["total"]) == ('"0"', 1), listed.text
            assert [i["name"] for i in listed.json()["items"]] == ["t"]
            tier = c.get("/admin/v1/tiers/t")
            assert tier.status_code == 200, tier.text
            assert tier.json()["tenant"]["tokens"][0]["limit"] == 1000000, tier.text
            for kind in ("models", "prices", "overrides"):
                assert c.get(f"/admin/v1/{kind}").json()["total"] == 0
            for single in ("global", "envoy", "ext-proc"):
                assert c.get(f"/admin/v1/{single}").status_code == 200
            assert c.get("/admin/v1/tiers/t/history").json() == [], "no change was made here"
            assert c.get("/admin/v1/tiers/none").status_code == 404
            # Writes still say where the configuration lives, and change nothing.
            tiers = c.put("/admin/v1/tiers/t", json=TIER)
            assert tiers.status_code == 409
            assert "SIGHUP" in tiers.json()["error"]["message"]
            assert c.get("/admin/v1/tiers/t").json() == tier.json()
            # The file edited and SIGHUP sent: the new tier is read, version 1.
            with open(s.config_path, "w") as f:
                f.write(CONFIG.replace("limit = 1000000", "limit = 2000000"))
            s.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while c.get("/admin/v1/tiers/t").json()["tenant"]["tokens"][0]["limit"] != 2000000:
                assert time.monotonic() < deadline, "the reload was never read"
                time.sleep(0.05)
            assert c.get("/admin/v1/tiers/t").headers["etag"] == '"1"'
    finally:
        s.stop()


def test_without_an_admin_token_the_admin_api_says_how_to_get_one():
    s = Service("[auth]\ntokens = [{ name = \"gw\", token = \"caller-token-for-the-tests\" }]\n", http=True)
    try:
        r = httpx.get(f"{s.http_url}/admin/v1/tiers", headers=CALLER)
        assert r.status_code == 403
        assert 'role = \\"admin\\"' in r.text or 'role = "admin"' in r.json()["error"]["message"]
    finally:
        s.stop()


def test_a_tenant_is_blocked_and_unblocked_on_both_replicas(a, b):
    blocked = a.put("/admin/v1/overrides/blocked-co/block", json={"reason": "unpaid invoice"})
    assert blocked.status_code == 201, "the block created the tenant's override: " + blocked.text
    deadline = time.monotonic() + 5
    while (r := reserve(b, "t", tenant="blocked-co")).status_code != 403:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.02)
    assert r.json()["reason"] == "REASON_BLOCKED" and "unpaid invoice" in r.json()["detail"]
    assert a.get("/admin/v1/overrides/blocked-co").json()["blocked"] == "unpaid invoice"
    assert a.put("/admin/v1/overrides/blocked-co/block", json={"why": "x"}).status_code == 400
    assert a.put("/admin/v1/tiers/t/block", json={"reason": "x"}).status_code == 404
    lifted = a.delete("/admin/v1/overrides/blocked-co/block")
    assert lifted.status_code == 200 and lifted.json()["new"] is None, "nothing else was in the override"
    deadline = time.monotonic() + 5
    while (r := reserve(b, "t", tenant="blocked-co")).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.02)
    again = a.delete("/admin/v1/overrides/blocked-co/block")
    assert again.status_code == 404 and "not blocked" in again.json()["error"]["message"]


def test_create_only_exists_only_and_versions_never_issued(a):
    created = a.put("/admin/v1/tiers/fresh", json=TIER, headers={"if-none-match": "*"})
    assert created.status_code == 201, created.text
    again = a.put("/admin/v1/tiers/fresh", json=dict(TIER, max_context_tokens=5000), headers={"if-none-match": "*"})
    assert again.status_code == 412 and "exists already" in again.json()["error"]["message"]
    missing = a.put("/admin/v1/tiers/nowhere", json=TIER, headers={"if-match": "*"})
    assert missing.status_code == 412 and "does not exist" in missing.json()["error"]["message"]
    assert a.get("/admin/v1/tiers/nowhere").status_code == 404, "nothing was written"
    current = int(etag(a.get("/admin/v1/tiers")).strip('"'))
    future = a.put("/admin/v1/tiers/fresh", json=TIER, headers={"if-match": f'"{current + 1000}"'})
    assert future.status_code == 412 and "never" in future.json()["error"]["message"]
    assert a.get("/admin/v1/tiers/fresh").json()["max_context_tokens"] == TIER["max_context_tokens"]
    assert a.delete("/admin/v1/tiers/fresh", headers={"if-match": "*"}).status_code == 200


def test_pages_of_other_sites_cannot_write_and_every_error_is_json(replicas, a):
    url = replicas[0].http_url
    forged = httpx.post(f"{url}/v1/check-and-reserve", content=b'{"tenantId":"acme","userId":"x","tier":"t"}',
                        headers={"content-type": "text/plain", "origin": "http://evil.example", **CALLER})
    assert forged.status_code == 403 and "another origin" in forged.json()["error"]["message"]
    same = httpx.post(f"{url}/v1/get-estimator", content=b"{}",
                      headers={"origin": url, **CALLER})
    assert same.status_code == 200, same.text
    # A request with a bad query or path is refused as JSON, and only after its token.
    assert httpx.get(f"{url}/admin/v1/history", params={"limit": "abc"}).status_code == 401
    bad = a.get("/admin/v1/history", params={"limit": "abc"})
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/json"
    bad = a.get("/admin/v1/tiers/%FF")
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    # A body is not read for a caller without a token, however large it says it is.
    big = httpx.put(f"{url}/admin/v1/tiers/t", content=b"x" * 100, headers={"content-length": "100"})
    assert big.status_code == 401
