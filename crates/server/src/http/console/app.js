// The ctxbudget console: one page over the admin API (/admin/v1/…) and the
// budget API (/v1/…), with an admin token kept in this tab (sessionStorage).
// No framework and no build step: elements are made with el(), text is set
// as text (never parsed as HTML), and each page is a function that fills
// <main> and may return a refresh to run every two seconds.
"use strict";

const TOKEN_KEY = "ctxbudget-admin-token";
// Where the service is, as the page was reached (behind a proxy that serves
// it under a path prefix too): /console/ is in it.
const BASE = location.pathname.replace(/console\/.*$/, "");
let refreshTimer = null;
// Bumped by every route and by log-out: a page still loading when another
// replaced it starts no refresh.
let generation = 0;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function status(text, isError) {
  const line = document.getElementById("status-line");
  line.textContent = text || "";
  line.className = isError ? "error" : "";
}

class ApiError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

// Calls the service with the admin token; JSON in and out unless told.
async function api(path, opts = {}) {
  const headers = Object.assign({ authorization: "Bearer " + sessionStorage.getItem(TOKEN_KEY) }, opts.headers || {});
  let body = opts.body;
  if (opts.json !== undefined) {
    body = JSON.stringify(opts.json);
    headers["content-type"] = "application/json";
  }
  const response = await fetch(BASE + path.replace(/^\//, ""), { method: opts.method || "GET", headers, body });
  if (response.status === 401 || (response.status === 403 && path.startsWith("/admin/"))) {
    const e = await response.json().catch(() => ({}));
    showLogin((e.error && e.error.message) || "log in again");
    throw new ApiError(response.status, "not logged in");
  }
  if (!response.ok) {
    const e = await response.json().catch(() => ({}));
    throw new ApiError(response.status, (e.error && e.error.message) || response.statusText);
  }
  const result = opts.raw ? response : await response.json();
  if (opts.withEtag) return { body: result, etag: response.headers.get("etag") };
  return result;
}

function num(v) { return typeof v === "string" ? Number(v) : (v || 0); }
function fmt(n) { return Number(n).toLocaleString("en-US"); }
function usd(micros) { return "$" + (num(micros) / 1e6).toFixed(2); }
function short(name) { return name.replace(/^(LEVEL|DIMENSION|REASON)_/, "").toLowerCase(); }
function today() { return new Date().toISOString().slice(0, 10); }
function dayAfter(d) { const t = new Date(d + "T00:00:00Z"); t.setUTCDate(t.getUTCDate() + 1); return t.toISOString().slice(0, 10); }

function bar(used, limit) {
  const share = limit > 0 ? Math.min(1, Math.max(0, used / limit)) : 0;
  const fill = el("div", { class: "fill" });
  fill.style.width = (share * 100).toFixed(1) + "%";
  const cls = share >= 1 ? "bar full" : share >= 0.8 ? "bar warn" : "bar";
  return el("div", { class: cls, "data-used": String(used), "data-limit": String(limit), title: fmt(used) + " of " + fmt(limit) }, fill);
}

// ---------- login ----------

function showLogin(message) {
  clearTimeout(refreshTimer);
  generation++;
  tiersCache = null;
  document.getElementById("login").hidden = false;
  document.getElementById("view").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("login-error").textContent = message || "";
}

async function logIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    const service = await api("/admin/v1/service");
    document.getElementById("login").hidden = true;
    document.getElementById("view").hidden = false;
    document.getElementById("logout").hidden = false;
    document.getElementById("who").textContent = service.store + " · configuration v" + service.config_version;
    route();
  } catch (e) {
    if (!(e instanceof ApiError && e.message === "not logged in")) showLogin(e.message);
  }
}

// ---------- routing ----------

const PAGES = { overview, tenants, tenant, ledger, quotas, estimator };

function route() {
  clearTimeout(refreshTimer);
  refreshTimer = null;
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [path, query] = hash.split("?");
  const parts = path.split("/").map(decodeURIComponent);
  const params = new URLSearchParams(query || "");
  let page = parts[0];
  if (page === "tenants" && parts[1]) page = "tenant";
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === parts[0]);
  }
  // Each page fills a container of its own: one a later route replaced
  // is detached, so what it adds late is never seen.
  const view = el("div");
  document.getElementById("view").replaceChildren(view);
  const show = PAGES[page] || overview;
  const mine = ++generation;
  status("");
  // The next refresh is scheduled once the last one is done: slow answers
  // never pile up.
  const again = (refresh) => {
    refreshTimer = setTimeout(() => {
      if (mine !== generation) return;
      refresh().catch((e) => status(e.message, true)).finally(() => { if (mine === generation) again(refresh); });
    }, 2000);
  };
  Promise.resolve(show(view, parts, params)).then((refresh) => {
    if (typeof refresh === "function" && mine === generation) again(refresh);
  }).catch((e) => status(e.message, true));
}

// ---------- overview ----------

// Prometheus text → [{name, labels, value}].
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[pair[1]] = pair[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sum(metrics, name, filter) {
  return metrics.filter((m) => m.name === name && (!filter || filter(m.labels))).reduce((a, m) => a + m.value, 0);
}

async function overview(view) {
  view.append(el("h1", {}, "Overview"));
  const cards = el("div", { class: "cards" });
  const denials = el("div", { class: "scroll" });
  const waits = el("div", { class: "scroll" });
  const health = el("p", { class: "note" });
  view.append(cards, el("h2", {}, "Denials by reason and level (since this replica started)"), denials,
    el("h2", {}, "Waiting in line for the shared account (since this replica started)"), waits,
    el("h2", {}, "Store"), health);
  let last = null;
  const refresh = async () => {
    const [text, service] = await Promise.all([api("/admin/v1/metrics", { raw: true }).then((r) => r.text()), api("/admin/v1/service")]);
    const metrics = parseMetrics(text);
    const now = performance.now() / 1000;
    const sample = {
      at: now,
      decisions: sum(metrics, "ctxbudget_decisions_total"),
      denied: sum(metrics, "ctxbudget_decisions_total", (l) => l.result === "denied"),
      tokens: sum(metrics, "ctxbudget_reserved_tokens_total"),
      degraded: sum(metrics, "ctxbudget_degraded_decisions_total"),
      waiting: sum(metrics, "ctxbudget_queue_waiting"),
    };
    const rate = (k) => (last && now > last.at ? Math.max(0, (sample[k] - last[k]) / (now - last.at)) : 0);
    cards.replaceChildren(
      card("decisions / s", rate("decisions").toFixed(1), "id-decisions"),
      card("tokens reserved / s", fmt(Math.round(rate("tokens"))), "id-tokens"),
      card("denials / s", rate("denied").toFixed(1), "id-denials"),
      card("decisions, all", fmt(sample.decisions), "id-total"),
      card("degraded decisions", fmt(sample.degraded), "id-degraded"),
      card("store breaker", service.breaker, "id-breaker"),
      card("calls waiting in line", fmt(sample.waiting), "id-waiting"),
    );
    last = sample;
    const rows = metrics.filter((m) => m.name === "ctxbudget_decisions_total" && m.labels.result === "denied" && m.value > 0);
    const byKey = new Map();
    for (const m of rows) {
      const key = m.labels.reason + "|" + m.labels.level;
      byKey.set(key, (byKey.get(key) || 0) + m.value);
    }
    const table = el("table", { id: "denials" }, el("tr", {}, el("th", {}, "reason"), el("th", {}, "level"), el("th", { class: "num" }, "denials")));
    for (const [key, value] of [...byKey.entries()].sort((a, b) => b[1] - a[1])) {
      const [reason, level] = key.split("|");
      table.append(el("tr", {}, el("td", {}, reason), el("td", {}, level), el("td", { class: "num" }, fmt(value))));
    }
    if (byKey.size === 0) table.append(el("tr", {}, el("td", { colspan: 3, class: "note" }, "no denials")));
    denials.replaceChildren(table);
    waits.replaceChildren(waitTable(metrics));
    health.textContent = service.store + "; breaker " + service.breaker + "; configuration version " +
      service.config_version + (service.live_configuration ? " (live, in Redis)" : " (from the file)");
  };
  await refresh();
  return refresh;
}

// How waits in line ended (ctxbudget_queue_wait_seconds by outcome): how
// many, and their mean wait.
function waitTable(metrics) {
  const table = el("table", { id: "waits" }, el("tr", {}, el("th", {}, "outcome"), el("th", { class: "num" }, "calls"),
    el("th", { class: "num" }, "mean wait (ms)")));
  let any = false;
  for (const outcome of ["granted", "expired", "denied", "cancelled", "full", "failed"]) {
    const count = sum(metrics, "ctxbudget_queue_wait_seconds_count", (l) => l.outcome === outcome);
    if (count === 0) continue;
    any = true;
    const mean = sum(metrics, "ctxbudget_queue_wait_seconds_sum", (l) => l.outcome === outcome) / count;
    table.append(el("tr", { "data-outcome": outcome }, el("td", {}, outcome), el("td", { class: "num" }, fmt(count)),
      el("td", { class: "num" }, fmt(Math.round(mean * 1000)))));
  }
  if (!any) table.append(el("tr", {}, el("td", { colspan: 3, class: "note" }, "no call has waited")));
  return table;
}

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
}

// ---------- tenants ----------

async function tenants(view, parts, params) {
  view.append(el("h1", {}, "Tenants"));
  const search = el("input", { id: "tenant-search", type: "search", placeholder: "search tenants", value: params.get("search") || "" });
  const list = el("div", { class: "scroll" });
  const pager = el("div", { class: "row" });
  view.append(el("div", { class: "row" }, search), list, pager);
  let offset = Number(params.get("offset") || 0);
  const limit = 50;
  const load = async () => {
    const q = new URLSearchParams({ search: search.value, offset, limit });
    const page = await api("/admin/v1/tenants?" + q);
    const table = el("table", { id: "tenant-list" }, el("tr", {}, el("th", {}, "tenant"), el("th", {}, "override"), el("th", {}, "blocked")));
    for (const t of page.items) {
      table.append(el("tr", {},
        el("td", {}, el("a", { class: "tenant-link", href: "#/tenants/" + encodeURIComponent(t.tenant) }, t.tenant)),
        el("td", {}, t.override ? "yes" : ""),
        el("td", {}, t.blocked || "")));
    }
    if (page.items.length === 0) table.append(el("tr", {}, el("td", { colspan: 3, class: "note" }, "no tenant matches")));
    list.replaceChildren(table);
    pager.replaceChildren(
      el("span", { class: "note", id: "tenant-count" }, page.total ? `${offset + 1}–${offset + page.items.length} of ${fmt(page.total)}` : "0 tenants"),
      el("button", { class: "secondary", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - limit); load(); } }, "Previous"),
      el("button", { class: "secondary", disabled: offset + limit >= page.total, onclick: () => { offset += limit; load(); } }, "Next"));
  };
  let timer = null;
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { offset = 0; load(); }, 200); });
  await load();
}

let tiersCache = null;
async function tierNames() {
  if (!tiersCache) tiersCache = (await api("/admin/v1/service")).tiers;
  return tiersCache;
}

async function tenant(view, parts, params) {
  const id = parts[1];
  const tiers = await tierNames();
  if (!tiers.length) {
    view.append(el("h1", {}, "Tenant " + id), el("p", { class: "error" }, "The configuration has no tiers: add one on the Quotas page."));
    return;
  }
  const remembered = localStorage.getItem("ctxbudget-tier:" + id);
  const tier = params.get("tier") || (tiers.includes(remembered) ? remembered : tiers[0]);
  const select = el("select", { id: "tier-select" }, tiers.map((t) => el("option", { value: t, selected: t === tier }, t)));
  select.addEventListener("change", () => {
    localStorage.setItem("ctxbudget-tier:" + id, select.value);
    location.hash = "#/tenants/" + encodeURIComponent(id) + "?tier=" + encodeURIComponent(select.value);
  });
  view.append(el("h1", {}, "Tenant ", el("span", { id: "tenant-name" }, id)),
    el("div", { class: "row" }, el("label", {}, "its calls' tier", select),
      el("a", { href: "#/ledger?tenant=" + encodeURIComponent(id) }, "ledger"),
      el("a", { href: "#/quotas?kind=overrides&name=" + encodeURIComponent(id) }, "override")));
  const body = el("div");
  view.append(body);
  const refresh = async () => {
    const t = await api("/admin/v1/tenants/" + encodeURIComponent(id) + "?tier=" + encodeURIComponent(tier));
    body.replaceChildren(...renderTenant(t));
  };
  await refresh();
  return refresh;
}

function limitLabel(l) {
  const scope = l.modelGroup ? " (" + l.modelGroup + ")" : "";
  const period = l.window ? "per " + l.window : num(l.periodSeconds) ? "per " + duration(num(l.periodSeconds)) : "at once";
  return short(l.dimension) + scope + " " + period;
}

// A period of a limit: 1d, 6h, 1m, 30s.
function duration(s) {
  if (s % 86400 === 0) return s / 86400 + "d";
  if (s % 3600 === 0) return s / 3600 + "h";
  if (s % 60 === 0) return s / 60 + "m";
  return s + "s";
}

// A time to wait, the two largest units: 28d 4h, 5m 41s, now.
function until(s) {
  if (s <= 0) return "now";
  const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  const parts = [];
  for (const [name, size] of units) {
    if (s >= size || parts.length) {
      parts.push(Math.floor(s / size) + name);
      s %= size;
    }
    if (parts.length === 2) break;
  }
  return parts.join(" ");
}

function limitsTable(limits, id) {
  const table = el("table", { id }, el("tr", {}, el("th", {}, "level"), el("th", {}, "limit"), el("th", { class: "num" }, "used"),
    el("th", { class: "num" }, "of"), el("th", {}, ""), el("th", { class: "num" }, "resets in")));
  for (const l of limits) {
    const limit = num(l.limit), used = limit - num(l.remaining);
    const money = l.dimension === "DIMENSION_SPEND";
    table.append(el("tr", { class: "limit-row", "data-key": short(l.level) + ":" + short(l.dimension) + ":" + num(l.periodSeconds) + ":" + (l.window || "") + ":" + (l.modelGroup || "") },
      el("td", {}, short(l.level)), el("td", {}, limitLabel(l)),
      el("td", { class: "num" }, money ? usd(used) : fmt(used)), el("td", { class: "num" }, money ? usd(limit) : fmt(limit)),
      el("td", {}, bar(used, limit)), el("td", { class: "num" }, until(Math.ceil(num(l.resetAfterMs) / 1000)))));
  }
  return el("div", { class: "scroll" }, table);
}

function renderTenant(t) {
  const out = [];
  const mine = t.status.limits.filter((l) => l.level === "LEVEL_TENANT");
  out.push(el("h2", {}, "Limits"), limitsTable(mine, "tenant-limits"));
  const leases = (t.status.leases || []).filter((l) => l.level === "LEVEL_TENANT");
  const active = leases.reduce((a, l) => a + num(l.active), 0);
  out.push(el("p", { id: "in-flight" }, "Reservations in flight: " + fmt(active)));
  out.push(el("h2", {}, "Spend this month"), ...burnDown(t));
  out.push(el("h2", {}, "Users nearest their limits"));
  const users = el("table", { id: "users" }, el("tr", {}, el("th", {}, "user"), el("th", { class: "num" }, "tightest"), el("th", {}, "")));
  for (const u of t.users) {
    users.append(el("tr", {}, el("td", {}, u.user), el("td", { class: "num" }, (u.used * 100).toFixed(0) + "%"), el("td", {}, bar(u.used, 1))));
  }
  if (t.users.length === 0) users.append(el("tr", {}, el("td", { colspan: 3, class: "note" }, "no user has usage today")));
  out.push(el("div", { class: "scroll" }, users));
  return out;
}

// Cumulative cost by day against the tenant's monthly spend limit (if any),
// with the day it runs out at this month's average pace.
function burnDown(t) {
  const days = new Map();
  for (const line of t.month.lines) days.set(line.period, (days.get(line.period) || 0) + num(line.cost_micros));
  const now = new Date();
  const year = now.getUTCFullYear(), month = now.getUTCMonth();
  const length = new Date(Date.UTC(year, month + 1, 0)).getUTCDate();
  const elapsed = now.getUTCDate();
  const cumulative = [];
  let total = 0;
  for (let d = 1; d <= elapsed; d++) {
    const key = `${year}-${String(month + 1).padStart(2, "0")}-${String(d).padStart(2, "0")}`;
    total += days.get(key) || 0;
    cumulative.push(total);
  }
  // The monthly spend limit (a daily or rolling one is no month's budget).
  const spend = t.status.limits.find((l) => l.level === "LEVEL_TENANT" && l.dimension === "DIMENSION_SPEND" && l.window === "month");
  const budget = spend ? num(spend.limit) : 0;
  const pace = total / elapsed;
  let verdict;
  if (!budget) verdict = `Spent ${usd(total)} this month; no spend limit applies to this tenant on this tier.`;
  else if (pace <= 0) verdict = `Spent ${usd(total)} of ${usd(budget)}; nothing spent yet, so no run-out is projected.`;
  else {
    const runOut = Math.ceil(budget / pace);
    verdict = runOut <= length
      ? `Spent ${usd(total)} of ${usd(budget)}; at ${usd(pace)} a day it runs out on day ${runOut} of the month.`
      : `Spent ${usd(total)} of ${usd(budget)}; at ${usd(pace)} a day it lasts the month.`;
  }
  const W = 600, H = 200, pad = 30;
  const top = Math.max(budget, total + pace * (length - elapsed), 1);
  const x = (d) => pad + ((W - 2 * pad) * d) / length;
  const y = (v) => H - pad - ((H - 2 * pad) * v) / top;
  const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, id: "burn-down", role: "img" });
  chart.append(svg("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#d8dde6" }));
  if (budget) {
    chart.append(svg("line", { class: "limit", x1: pad, y1: y(budget), x2: W - pad, y2: y(budget) }));
    chart.append(svg("text", { x: pad, y: y(budget) - 4 }, "limit " + usd(budget)));
  }
  const points = cumulative.map((v, i) => `${x(i + 1)},${y(v)}`).join(" ");
  chart.append(svg("polyline", { class: "spent", points: `${x(0)},${y(0)} ${points}` }));
  chart.append(svg("polyline", { class: "projected", points: `${x(elapsed)},${y(total)} ${x(length)},${y(total + pace * (length - elapsed))}` }));
  chart.append(svg("text", { x: pad, y: H - 8 }, "day 1"), svg("text", { x: W - pad - 30, y: H - 8 }, "day " + length));
  return [chart, el("p", { id: "burn-verdict" }, verdict)];
}

// ---------- ledger ----------

async function ledger(view, parts, params) {
  view.append(el("h1", {}, "Ledger"));
  const tenantIn = el("input", { id: "ledger-tenant", value: params.get("tenant") || "", placeholder: "tenant", required: true });
  const month = today().slice(0, 8) + "01";
  const fromIn = el("input", { id: "ledger-from", type: "date", value: month });
  const toIn = el("input", { id: "ledger-to", type: "date", value: dayAfter(today()) });
  const byIn = el("select", { id: "ledger-by" }, ["day", "hour", "month"].map((b) => el("option", { value: b }, b)));
  const out = el("div", { class: "scroll" });
  const query = () => new URLSearchParams({ tenant: tenantIn.value, from: fromIn.value, to: toIn.value, by: byIn.value });
  const show = async (ev) => {
    if (ev) ev.preventDefault();
    const r = await api("/admin/v1/usage?" + query());
    const table = el("table", { id: "usage" }, el("tr", {}, ["period", "model group", "requests", "prompt", "cached", "completion", "cost", "unsettled"].map((h) => el("th", {}, h))));
    for (const l of r.lines.concat([r.total])) {
      table.append(el("tr", {}, el("td", {}, l.period), el("td", {}, l.period === "total" ? "" : (l.model_group || (r.grouped ? "other models" : "all models"))),
        el("td", { class: "num" }, fmt(l.requests)), el("td", { class: "num" }, fmt(l.prompt_tokens)), el("td", { class: "num" }, fmt(l.cached_prompt_tokens)),
        el("td", { class: "num" }, fmt(l.completion_tokens)), el("td", { class: "num" }, "$" + l.cost_usd), el("td", { class: "num" }, fmt(l.unsettled))));
    }
    out.replaceChildren(table);
  };
  const exportCsv = async () => {
    const q = query();
    q.set("format", "csv");
    const response = await api("/admin/v1/usage?" + q, { raw: true });
    const blob = await response.blob();
    const link = el("a", { href: URL.createObjectURL(blob), download: `usage-${tenantIn.value}-${fromIn.value}-${toIn.value}.csv` });
    document.body.append(link);
    link.click();
    link.remove();
  };
  view.append(el("form", { class: "row", onsubmit: (e) => show(e).catch((x) => status(x.message, true)) },
    el("label", {}, "tenant", tenantIn), el("label", {}, "from", fromIn), el("label", {}, "to (exclusive)", toIn), el("label", {}, "by", byIn),
    el("button", { type: "submit", id: "ledger-show" }, "Show"),
    el("button", { type: "button", class: "secondary", id: "ledger-export", onclick: () => exportCsv().catch((x) => status(x.message, true)) }, "Export CSV")), out);

  view.append(el("h2", {}, "Reconcile a provider export"),
    el("p", { class: "note" }, "A CSV with a header line: hour_start, model, input_tokens, output_tokens, and optionally cached_input_tokens, cache_write_input_tokens, cache_write_1h_input_tokens, reasoning_tokens, cost (docs/money.md). Compared per hour and model group, over the range above, across every tenant unless the tenant is given."));
  const file = el("input", { id: "reconcile-file", type: "file", accept: ".csv,text/csv" });
  const drift = el("input", { id: "reconcile-drift", value: "1%", size: 5 });
  const columns = el("input", { id: "reconcile-columns", placeholder: "hour_start=start_time,…" });
  const result = el("div", { class: "scroll", id: "reconcile-result" });
  const run = async () => {
    if (!file.files.length) throw new Error("choose the provider's CSV export first");
    const q = new URLSearchParams({ from: fromIn.value, to: toIn.value, max_drift: drift.value });
    if (columns.value) q.set("columns", columns.value);
    if (tenantIn.value) q.set("tenant", tenantIn.value);
    const r = await api("/admin/v1/reconcile?" + q, { method: "POST", body: await file.files[0].text(), headers: { "content-type": "text/csv" } });
    const table = el("table", { id: "reconcile-table" }, el("tr", {}, ["hour", "model group", "input ours / theirs", "drift", "output ours / theirs", "drift", "cost ours / theirs", "unsettled", ""].map((h) => el("th", {}, h))));
    const pct = (m) => (m && m.drift_pct !== null ? m.drift_pct.toFixed(2) + "%" : "new");
    for (const row of r.rows) {
      table.append(el("tr", { class: row.flagged ? "drift" : "" }, el("td", {}, row.hour), el("td", {}, row.model_group || "all models"),
        el("td", { class: "num" }, fmt(row.input_tokens.ours) + " / " + fmt(row.input_tokens.theirs)), el("td", { class: "num" }, pct(row.input_tokens)),
        el("td", { class: "num" }, fmt(row.output_tokens.ours) + " / " + fmt(row.output_tokens.theirs)), el("td", { class: "num" }, pct(row.output_tokens)),
        el("td", { class: "num" }, row.cost_micros ? usd(row.cost_micros.ours) + " / " + usd(row.cost_micros.theirs) : "-"),
        el("td", { class: "num" }, fmt(row.unsettled)), el("td", {}, row.flagged ? "DRIFT" : "ok")));
    }
    result.replaceChildren(el("p", { id: "reconcile-summary", class: r.flagged ? "error" : "ok" },
      `${r.flagged} of ${r.rows.length} rows drift more than ${r.max_drift_pct}% (${r.tenants} tenants in the ledger for the range)`), table);
  };
  view.append(el("div", { class: "row" }, el("label", {}, "export", file), el("label", {}, "max drift", drift), el("label", {}, "columns", columns),
    el("button", { type: "button", id: "reconcile-run", onclick: () => run().catch((x) => status(x.message, true)) }, "Reconcile")), result);
  if (tenantIn.value) await show();
}

// ---------- quotas ----------

const KINDS = ["tiers", "models", "prices", "overrides", "global", "envoy", "ext-proc"];
const NAMED = new Set(["tiers", "models", "prices", "overrides"]);

async function quotas(view, parts, params) {
  const kind = KINDS.includes(params.get("kind")) ? params.get("kind") : "tiers";
  view.append(el("h1", {}, "Quotas"));
  view.append(el("div", { class: "tabs", id: "kind-tabs" }, KINDS.map((k) =>
    el("button", { type: "button", "data-kind": k, class: k === kind ? "active" : "", onclick: () => { location.hash = "#/quotas?kind=" + k; } }, k))));
  const left = el("div");
  const right = el("div", { id: "doc-pane" });
  view.append(el("div", { class: "split" }, left, right));
  if (!NAMED.has(kind)) {
    left.append(el("p", { class: "note" }, "One document: its defaults apply until one is stored."));
    await openDoc(right, kind, null);
    return;
  }
  const search = el("input", { id: "doc-search", type: "search", placeholder: "search " + kind });
  const list = el("ul", { class: "list", id: "doc-list" });
  const newName = el("input", { id: "new-name", placeholder: "new " + kind.replace(/s$/, "") + " name" });
  left.append(search, list, el("div", { class: "row" }, newName,
    el("button", { type: "button", class: "secondary", onclick: () => { if (newName.value) openDoc(right, kind, newName.value, true); } }, "New")));
  const load = async () => {
    const page = await api(`/admin/v1/${kind}?` + new URLSearchParams({ search: search.value, limit: 200 }));
    list.replaceChildren(...page.items.map((i) => el("li", {}, el("a", {
      href: "#/quotas?kind=" + kind + "&name=" + encodeURIComponent(i.name), class: "doc-link" + (i.name === params.get("name") ? " active" : ""), "data-name": i.name,
    }, i.name))));
    if (page.total > page.items.length) list.append(el("li", { class: "note" }, `${page.total - page.items.length} more: search to narrow`));
  };
  let timer = null;
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(load, 200); });
  await load();
  if (params.get("name")) await openDoc(right, kind, params.get("name"));
}

// A line diff of two texts (longest common subsequence): [[" "|"+"|"-", line]].
function diffLines(a, b) {
  const x = a.split("\n"), y = b.split("\n");
  const n = x.length, m = y.length;
  const L = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (x[i] === y[j]) { out.push([" ", x[i]]); i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) out.push(["-", x[i++]]);
    else out.push(["+", y[j++]]);
  }
  while (i < n) out.push(["-", x[i++]]);
  while (j < m) out.push(["+", y[j++]]);
  return out;
}

async function openDoc(pane, kind, name, creating) {
  const path = "/admin/v1/" + kind + (name ? "/" + encodeURIComponent(name) : "");
  let current = "", etag = null;
  if (!creating) {
    const got = await api(path, { withEtag: true });
    current = JSON.stringify(got.body, null, 2);
    etag = got.etag;
  }
  const editor = el("textarea", { id: "editor", spellcheck: "false" });
  editor.value = creating ? "{\n}" : current;
  const diff = el("pre", { class: "diff", id: "diff", hidden: true });
  const message = el("p", { id: "doc-message" });
  const apply = el("button", { type: "button", id: "apply", hidden: true }, "Apply");
  const history = el("ul", { class: "history", id: "history" });
  // What Apply sends: the text as reviewed, never an edit made after.
  let reviewed = null;
  editor.addEventListener("input", () => { apply.hidden = true; reviewed = null; });
  const review = () => {
    message.textContent = "";
    let next;
    try { next = JSON.stringify(JSON.parse(editor.value), null, 2); } catch (e) { message.textContent = "Not JSON: " + e.message; message.className = "error"; return; }
    diff.replaceChildren(...diffLines(current, next).map(([op, line]) => el("span", { class: op === "+" ? "add" : op === "-" ? "del" : "" }, op + " " + line + "\n")));
    diff.hidden = false;
    apply.hidden = next === current;
    reviewed = next;
    if (next === current) { message.textContent = "No change."; message.className = "note"; }
  };
  apply.addEventListener("click", async () => {
    try {
      if (reviewed === null) return;
      // Replace what was read, or create what did not exist: never both.
      const headers = etag ? { "if-match": etag } : { "if-none-match": "*" };
      const r = await api(path, { method: "PUT", body: reviewed, headers: Object.assign({ "content-type": "application/json" }, headers) });
      message.textContent = `Applied as configuration version ${r.version}; every replica applies it within a second.` + (r.note ? " " + r.note : "");
      message.className = "ok";
      await openDoc(pane, kind, name, false);
      pane.querySelector("#doc-message").textContent = message.textContent;
      pane.querySelector("#doc-message").className = "ok";
    } catch (e) {
      message.textContent = e.message;
      message.className = "error";
    }
  });
  const remove = el("button", { type: "button", class: "danger", id: "delete" }, NAMED.has(kind) ? "Delete" : "Reset to defaults");
  remove.addEventListener("click", async () => {
    if (!confirm(`${NAMED.has(kind) ? "Delete" : "Reset"} ${kind}${name ? " " + name : ""}?`)) return;
    try {
      await api(path, { method: "DELETE", headers: etag ? { "if-match": etag } : {} });
      location.hash = "#/quotas?kind=" + kind;
    } catch (e) { message.textContent = e.message; message.className = "error"; }
  });
  pane.replaceChildren(el("h2", {}, (name ? kind.replace(/s$/, "") + " " + name : kind) + (creating ? " (new)" : "")),
    editor, el("div", { class: "row" }, el("button", { type: "button", id: "review", onclick: review }, "Review change"), apply, creating ? null : remove),
    diff, message, el("h2", {}, "History"), history);
  if (!creating) {
    const entries = await api(path + "/history");
    for (const e of entries) {
      history.append(el("li", {}, el("strong", {}, e.at + " UTC"), " · ", el("span", { class: "actor" }, e.actor), " · ", e.what,
        " (version " + e.version + ")", el("div", { class: "changes" }, e.changes.join("\n"))));
    }
    if (!entries.length) history.append(el("li", { class: "note" }, "no change recorded (seeded from a file, or older than the log)"));
  }
}

// ---------- estimator ----------

async function estimator(view) {
  view.append(el("h1", {}, "Estimator"));
  const [r, text] = await Promise.all([api("/v1/get-estimator", { method: "POST", json: {} }), api("/admin/v1/metrics", { raw: true }).then((x) => x.text())]);
  const metrics = parseMetrics(text);
  const table = el("table", { id: "estimators" }, el("tr", {}, ["key", "correction", "multiplier", "samples", "p95 actual ÷ estimate", "fit", "learned output", "under-reserved (since start)"].map((h) => el("th", {}, h))));
  for (const s of r.keys || []) {
    const fit = s.contentFit ? `${(s.contentFit.costs || []).map((c) => c.group + " ×" + Number(c.cost).toFixed(3)).join(", ")}; +${Number(s.contentFit.constant).toFixed(1)}` : "-";
    const learned = (s.learnedOutputs || []).map((l) => `${l.tier}: ${fmt(l.tokens)} (${fmt(l.samples)})`).join("; ") || "-";
    const under = sum(metrics, "ctxbudget_estimator_under_reserved_total", (l) => l.key === s.key);
    table.append(el("tr", {}, el("td", {}, s.key), el("td", {}, s.correction), el("td", { class: "num" }, Number(s.multiplier).toFixed(3)),
      el("td", { class: "num" }, fmt(s.samples)), el("td", { class: "num" }, Number(s.p95Ratio).toFixed(3)), el("td", {}, fit), el("td", {}, learned),
      el("td", { class: "num" }, num(s.samples) ? `${fmt(under)} (${((100 * under) / num(s.samples)).toFixed(1)}% of samples)` : fmt(under))));
  }
  if (!(r.keys || []).length) table.append(el("tr", {}, el("td", { colspan: 8, class: "note" }, "no estimator key has samples yet")));
  view.append(el("div", { class: "scroll" }, table));
}

// ---------- start ----------

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    logIn(document.getElementById("token").value.trim());
  });
  document.getElementById("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });
  window.addEventListener("hashchange", () => { if (sessionStorage.getItem(TOKEN_KEY)) route(); });
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) logIn(token); else showLogin("");
});
