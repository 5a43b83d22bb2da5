"""The console (``/console``) driven in a real headless browser (Debian's
``chromium`` through ``chromedriver`` and selenium; nothing downloaded), on
two replicas sharing a Redis, with 1,000 tenants in the ledger: log in with an
admin token, find one tenant among the thousand and watch its usage bar move
after traffic, edit a tier (a diff, then apply) and see the change in its
history and on the other replica, reconcile a provider export with one
drifted row, and read every page on a narrow screen.

With ``CTXBUDGET_CONSOLE_SCREENSHOTS=<dir>`` the pages are saved there as
PNG (docs/console.md shows them)."""

from __future__ import annotations

import concurrent.futures
import csv
import datetime
import io
import json
import os
import shutil
import tempfile
import time

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from conftest import Redis, Service

CONFIG = """
[reservations]
retry_jitter_ms = 0

[models.gpt-4o]
match = ["gpt-4o*"]

[models.slow]
match = ["slow*"]
global = { concurrency = 1 }

[prices.gpt-4o]
input = 2.50
output = 10.00

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 1000
tenant = { requests = [{ limit = 1000, period = "1d" }], tokens = [{ limit = 2000000, period = "1d" }], spend = [{ limit_usd = 1, window = "month" }], concurrency = 20 }
user = { requests = [{ limit = 100, period = "1d" }] }

[auth]
tokens = [
  { name = "ops", token = "console-admin-token-0123", role = "admin" },
  { name = "gateway", token = "console-caller-token-012" },
]
"""
ADMIN_TOKEN = "console-admin-token-0123"
CALLER = {"authorization": "Bearer console-caller-token-012"}
TENANTS = 1000
WAIT = 20


def chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail("no chromium/chromedriver: apt-get install -y chromium chromium-driver (scripts/test.sh does)")
    return browser, driver


def call(client: httpx.Client, tenant: str, user: str = "u1", prompt: int = 1000, completion: int = 500) -> None:
    r = client.post("/v1/check-and-reserve", headers=CALLER, json={
        "tenantId": tenant, "userId": user, "tier": "t", "model": "gpt-4o", "promptTokens": prompt,
        "maxOutputTokens": completion})
    assert r.status_code == 200, r.text
    c = client.post("/v1/commit", headers=CALLER, json={
        "reservationId": r.json()["reservationId"], "promptTokens": prompt, "completionTokens": completion})
    assert c.status_code == 200, c.text


@pytest.fixture(scope="module")
def world():
    redis = Redis()
    a = Service(CONFIG, redis_url=redis.url, http=True)
    b = Service(CONFIG, redis_url=redis.url, http=True)
    names = [f"tenant-{i:04d}" for i in range(TENANTS)]

    def seed(chunk: list[str]) -> None:
        with httpx.Client(base_url=a.http_url, timeout=30) as client:
            for name in chunk:
                call(client, name)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(seed, [names[i::4] for i in range(4)]))
    # Calls whose prompt the service counts: the estimator learns from them.
    with httpx.Client(base_url=a.http_url, timeout=30) as client:
        for i in range(12):
            r = client.post("/v1/check-and-reserve", headers=CALLER, json={
                "tenantId": "tenant-0001", "userId": "writer", "tier": "t", "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "Summarise the quarterly report, please. " * (5 + i)}],
                "maxOutputTokens": 100})
            assert r.status_code == 200, r.text
            counted = int(r.json()["estimatedPromptTokens"])
            client.post("/v1/commit", headers=CALLER, json={
                "reservationId": r.json()["reservationId"], "promptTokens": counted + 7, "completionTokens": 40})
    yield a, b
    a.stop()
    b.stop()
    redis.stop()


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", f"--user-data-dir={tempfile.mkdtemp(prefix='ctxbudget-chromium-')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService(driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def shot(driver, name: str) -> None:
    target = os.environ.get("CTXBUDGET_CONSOLE_SCREENSHOTS")
    if target:
        os.makedirs(target, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, max(600, min(height + 120, 2400)))
        driver.save_screenshot(os.path.join(target, f"{name}.png"))


def wait(driver, condition, timeout: float = WAIT):
    # A page that refreshes itself replaces elements: look again.
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(condition)


def text_of(driver, css: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, css).text


def log_in(driver, base: str) -> None:
    driver.get(base + "/console/")
    driver.execute_script("sessionStorage.clear()")
    driver.refresh()
    wait(driver, EC.visibility_of_element_located((By.ID, "token"))).send_keys(ADMIN_TOKEN)
    driver.find_element(By.ID, "login-button").click()
    wait(driver, EC.presence_of_element_located((By.ID, "id-decisions")))


def test_log_in_with_a_caller_token_is_refused_then_an_admin_token_works(world, browser):
    a, _ = world
    browser.get(a.http_url + "/console/")
    wait(browser, EC.visibility_of_element_located((By.ID, "token"))).send_keys("console-caller-token-012")
    browser.find_element(By.ID, "login-button").click()
    wait(browser, lambda d: "role" in text_of(d, "#login-error"))
    browser.execute_script("sessionStorage.clear()")
    log_in(browser, a.http_url)
    wait(browser, lambda d: int(text_of(d, "#id-total .value").replace(",", "")) >= TENANTS)
    # Traffic while the page watches: one user past its 100 requests a day.
    with httpx.Client(base_url=a.http_url, timeout=30) as client:
        denied = 0
        for _ in range(110):
            r = client.post("/v1/check-and-reserve", headers=CALLER, json={
                "tenantId": "busy", "userId": "hog", "tier": "t", "model": "gpt-4o", "promptTokens": 10,
                "maxOutputTokens": 10})
            if r.status_code == 200:
                client.post("/v1/commit", headers=CALLER, json={
                    "reservationId": r.json()["reservationId"], "promptTokens": 10, "completionTokens": 1})
            else:
                denied += 1
        assert denied == 10
    wait(browser, lambda d: float(text_of(d, "#id-decisions .value")) > 0)
    wait(browser, lambda d: "rpm_exceeded" in text_of(d, "#denials") and "user" in text_of(d, "#denials"))
    assert "breaker" in text_of(browser, "#id-breaker .label")
    assert "redis" in text_of(browser, "#who").lower()
    # A call waiting in line for the shared account shows, then how it ended.
    slow = {"tenantId": "busy", "userId": "w", "tier": "t", "model": "slow-1", "promptTokens": 10, "maxOutputTokens": 10}
    with httpx.Client(base_url=a.http_url, timeout=30) as client:
        held = client.post("/v1/check-and-reserve", headers=CALLER, json=slow).json()
        assert held["allowed"], held
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiter = pool.submit(lambda: httpx.post(a.http_url + "/v1/check-and-reserve", headers=CALLER,
                                                    json={**slow, "maxWaitMs": 20000}, timeout=30).json())
            wait(browser, lambda d: text_of(d, "#id-waiting .value") == "1")
            client.post("/v1/refund", headers=CALLER, json={"reservationId": held["reservationId"]})
            granted = waiter.result()
        assert granted["allowed"] and int(granted["waitedMs"]) > 0, granted
        client.post("/v1/refund", headers=CALLER, json={"reservationId": granted["reservationId"]})
    wait(browser, lambda d: text_of(d, "#id-waiting .value") == "0" and "granted" in text_of(d, "#waits"))
    shot(browser, "overview")


def bar_used(driver, key_prefix: str) -> float:
    rows = driver.find_elements(By.CSS_SELECTOR, "#tenant-limits .limit-row")
    for row in rows:
        if row.get_attribute("data-key").startswith(key_prefix):
            return float(row.find_element(By.CSS_SELECTOR, ".bar").get_attribute("data-used"))
    raise AssertionError(f"no limit {key_prefix} among {[r.get_attribute('data-key') for r in rows]}")


def test_find_a_tenant_among_a_thousand_and_see_its_bar_move(world, browser):
    a, _ = world
    log_in(browser, a.http_url)
    browser.get(a.http_url + "/console/#/tenants")
    # The thousand seeded, and "busy" of the overview's traffic.
    wait(browser, lambda d: text_of(d, "#tenant-count").endswith(f"of {TENANTS + 1:,}"))
    search = browser.find_element(By.ID, "tenant-search")
    search.send_keys("tenant-0777")
    wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".tenant-link")) == 1)
    shot(browser, "tenants")
    browser.find_element(By.CSS_SELECTOR, ".tenant-link").click()
    wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, "#tenant-limits .limit-row")))
    assert bar_used(browser, "tenant:requests:86400") == 1
    before_spend = bar_used(browser, "tenant:spend")
    with httpx.Client(base_url=a.http_url, timeout=30) as client:
        for user in ("u1", "u2", "u3"):
            call(client, "tenant-0777", user=user, prompt=20000, completion=2000)
    # The page refreshes itself every two seconds.
    wait(browser, lambda d: bar_used(d, "tenant:requests:86400") == 4)
    assert bar_used(browser, "tenant:spend") > before_spend
    assert "u1" in text_of(browser, "#users")
    assert "Spent $" in text_of(browser, "#burn-verdict")
    shot(browser, "tenant")


def test_edit_a_tier_see_the_diff_the_history_and_the_other_replica(world, browser):
    a, b = world
    log_in(browser, a.http_url)
    browser.get(a.http_url + "/console/#/quotas?kind=tiers&name=t")
    editor = wait(browser, EC.presence_of_element_located((By.ID, "editor")))
    wait(browser, lambda d: '"max_context_tokens"' in editor.get_attribute("value"))
    tier = json.loads(editor.get_attribute("value"))
    tier["user"]["requests"][0]["limit"] = 42
    browser.execute_script("arguments[0].value = arguments[1]", editor, json.dumps(tier, indent=2))
    browser.find_element(By.ID, "review").click()
    diff = wait(browser, EC.visibility_of_element_located((By.ID, "diff")))
    assert '+         "limit": 42' in diff.text.replace("\u00a0", " ") or "+" in diff.text and "42" in diff.text
    assert "- " in diff.text and "100" in diff.text
    shot(browser, "quotas")
    browser.find_element(By.ID, "apply").click()
    wait(browser, lambda d: "Applied" in text_of(d, "#doc-message"))
    wait(browser, lambda d: "ops (admin API)" in text_of(d, "#history"))
    assert "user.requests" in text_of(browser, "#history")
    # The other replica applies it.
    deadline = time.monotonic() + 5
    with httpx.Client(base_url=b.http_url, timeout=30) as client:
        while True:
            r = client.post("/v1/check-and-reserve", headers=CALLER, json={
                "tenantId": "fresh", "userId": f"u{time.monotonic_ns()}", "tier": "t", "model": "gpt-4o",
                "promptTokens": 10, "maxOutputTokens": 10})
            if r.headers.get("x-ratelimit-limit-requests") == "42":
                break
            assert time.monotonic() < deadline, r.headers
            time.sleep(0.05)
    shot(browser, "quotas-applied")


def test_reconcile_an_export_with_one_drifted_row(world, browser, tmp_path):
    a, _ = world
    today = datetime.datetime.now(datetime.timezone.utc).date()
    with httpx.Client(base_url=a.http_url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        hours = client.get("/admin/v1/usage", params={
            "tenant": "tenant-0777", "from": str(today), "to": str(today + datetime.timedelta(days=1)), "by": "hour"}).json()["lines"]
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["hour_start", "model", "input_tokens", "output_tokens"])
    for i, line in enumerate(hours):
        prompt = line["prompt_tokens"] * (3 if i == 0 else 1)
        w.writerow([line["period"].replace("Z", ":00Z"), "gpt-4o", prompt, line["completion_tokens"]])
    export = tmp_path / "provider-export.csv"
    export.write_text(out.getvalue())

    log_in(browser, a.http_url)
    browser.get(a.http_url + "/console/#/ledger?tenant=tenant-0777")
    wait(browser, lambda d: "total" in text_of(d, "#usage"))
    browser.find_element(By.ID, "reconcile-file").send_keys(str(export))
    browser.find_element(By.ID, "reconcile-run").click()
    wait(browser, lambda d: text_of(d, "#reconcile-summary").startswith("1 of"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#reconcile-table tr.drift")) == 1
    shot(browser, "ledger")


def test_the_estimator_page_and_a_narrow_screen(world, browser):
    a, _ = world
    log_in(browser, a.http_url)
    browser.get(a.http_url + "/console/#/estimator")
    wait(browser, EC.presence_of_element_located((By.ID, "estimators")))
    # Twelve calls whose prompt the service counted, each committed with the
    # upstream's count: the key they map to has learned from them.
    rows = [r.text.split() for r in browser.find_elements(By.CSS_SELECTOR, "#estimators tr")[1:]]
    assert any(r[0] == "gpt-4o" and r[3] == "12" for r in rows), rows
    shot(browser, "estimator")
    browser.set_window_size(390, 844)
    try:
        for page in ("overview", "tenants", "tenants/tenant-0777", "quotas", "ledger?tenant=tenant-0777", "estimator"):
            browser.get(a.http_url + "/console/#/" + page)
            wait(browser, lambda d: d.find_element(By.ID, "view").text.strip() != "")
            time.sleep(0.3)
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{page} scrolls sideways by {overflow}px on a narrow screen"
        browser.get(a.http_url + "/console/#/tenants/tenant-0777")
        wait(browser, EC.presence_of_element_located((By.CSS_SELECTOR, "#tenant-limits .limit-row")))
        shot(browser, "narrow")
    finally:
        browser.set_window_size(1280, 1000)
