//! The admin API's and the console's part of the OpenAPI document: every
//! route `admin`, `ledger`, `tenants` and `console` serve, and the shapes
//! they answer. The configuration documents themselves are described by
//! docs/configuration.md (their keys are the configuration file's).

use super::openapi_parts::{errors, returns, schema};
use crate::admin::documents::{KINDS, Kind};
use serde_json::{Map, Value, json};

/// The errors of an admin route.
fn admin_errors() -> Map<String, Value> {
    errors(&[
        (
            "400",
            "A parameter or the document is in error; nothing was written.",
        ),
        ("401", "No bearer token, or not a configured one."),
        (
            "403",
            "Not an admin token (or no admin token is configured).",
        ),
        ("503", "The store cannot answer."),
    ])
}

/// An admin operation.
fn op(id: &str, summary: &str, ok: Value, more: &[(&str, &str)], extra: Value) -> Value {
    let mut responses = admin_errors();
    responses.insert("200".into(), ok);
    responses.extend(errors(more));
    let mut out =
        json!({ "operationId": id, "summary": summary, "tags": ["admin"], "responses": responses });
    if let (Value::Object(o), Value::Object(e)) = (&mut out, extra) {
        o.extend(e);
    }
    out
}

fn query(name: &str, required: bool, description: &str) -> Value {
    json!({ "name": name, "in": "query", "required": required, "description": description,
            "schema": { "type": "string" } })
}

fn path_param(name: &str, description: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description,
            "schema": { "type": "string" } })
}

fn document_body() -> Value {
    json!({ "requestBody": { "required": true, "content": {
        "application/json": { "schema": schema("Document") },
        "application/toml": { "schema": { "type": "string" } },
    } } })
}

/// A write's answers beyond an admin route's: created, and a body too large.
fn writes(mut op: Value) -> Value {
    let responses = &mut op["responses"];
    responses["201"] = returns("Created: the version it made (also in ETag).", "Written");
    responses["413"] = returns(
        "The document is larger than [server] max_message_bytes.",
        "Error",
    );
    op
}

fn if_none_match() -> Value {
    json!({ "name": "If-None-Match", "in": "header", "required": false,
            "description": "`*`: create only — refused 412 if the document exists.",
            "schema": { "type": "string", "enum": ["*"] } })
}

fn if_match() -> Value {
    json!({ "name": "If-Match", "in": "header", "required": false,
            "description": "The configuration version (ETag) the document was read at: the write is refused 412 if the document changed after it (or the version was never reached). `*`: refused 412 unless the document exists.",
            "schema": { "type": "string" } })
}

/// What a write answers.
fn written() -> Value {
    returns("Written: the version it made (also in ETag).", "Written")
}

/// The errors of the documents' routes: not found, the in-memory store (a
/// write: reads answer the file's configuration there), stale.
const STALE: [(&str, &str); 3] = [
    ("404", "No such document."),
    (
        "409",
        "This replica's configuration is its file (the in-memory store).",
    ),
    (
        "412",
        "The document changed after the version in If-Match; nothing was written.",
    ),
];

/// Every admin and console route.
pub(super) fn paths(paths: &mut Map<String, Value>) {
    documents(paths);
    ledger(paths);
    console(paths);
}

/// The configuration documents' routes, blocks and history.
fn documents(paths: &mut Map<String, Value>) {
    let stale = STALE;
    for kind in KINDS {
        let seg = kind.segment();
        let base = format!("/admin/v1/{seg}");
        if kind.named() {
            paths.insert(
                base.clone(),
                json!({ "get": op(
                &format!("list-{seg}"), &format!("List {seg} (paged, searched)"),
                returns("A page of documents; the configuration version in ETag.", "DocumentList"),
                &[],
                json!({ "parameters": [
                    query("search", false, "Only names containing this (case-insensitive)."),
                    query("offset", false, "Items to skip."),
                    query("limit", false, "Items to return: 1 to 1000, 100 by default."),
                ] })) }),
            );
            let name = path_param("name", "The document's name (tier, model group, tenant).");
            paths.insert(format!("{base}/{{name}}"), json!({
                "get": op(&format!("get-{seg}"), &format!("One of the {seg}"), returns("The document; the configuration version in ETag.", "Document"), &stale[..1], json!({ "parameters": [name] })),
                "put": writes(op(&format!("set-{seg}"), &format!("Create (201) or replace one of the {seg}"), written(), &stale, merge(json!({ "parameters": [name, if_match(), if_none_match()] }), document_body()))),
                "delete": op(&format!("delete-{seg}"), &format!("Delete one of the {seg}"), written(), &stale, json!({ "parameters": [name, if_match()] })),
            }));
            paths.insert(format!("{base}/{{name}}/history"), json!({ "get": op(
                &format!("history-{seg}"), "Its changes, newest first",
                returns("The audit entries.", "History"), &[],
                json!({ "parameters": [name, query("limit", false, "Entries, 100 by default.")] })) }));
        } else {
            let what = match kind {
                Kind::Envoy => "the Envoy descriptor map",
                Kind::ExtProc => "the external processor's settings",
                _ => "the global limits",
            };
            paths.insert(base.clone(), json!({
                "get": op(&format!("get-{seg}"), &format!("Read {what} (the defaults when none is stored)"), returns("The document; the configuration version in ETag.", "Document"), &[], json!({})),
                "put": writes(op(&format!("set-{seg}"), &format!("Replace {what}"), written(), &stale, merge(json!({ "parameters": [if_match(), if_none_match()] }), document_body()))),
                "delete": op(&format!("reset-{seg}"), &format!("Reset {what} to the defaults"), written(), &stale, json!({ "parameters": [if_match()] })),
            }));
            paths.insert(format!("{base}/history"), json!({ "get": op(
                &format!("history-{seg}"), "Its changes, newest first", returns("The audit entries.", "History"), &[], json!({})) }));
        }
    }
    let tenant = path_param("name", "The tenant.");
    paths.insert("/admin/v1/overrides/{name}/block".into(), json!({
        "put": writes(op("block", "Refuse all traffic of the tenant, or of one user of it (kept in its override)", written(), &stale,
            json!({ "parameters": [tenant, if_match()], "requestBody": { "required": true, "content": { "application/json": { "schema": {
                "type": "object", "required": ["reason"], "properties": {
                    "reason": { "type": "string", "description": "Why: shown to every refused caller." },
                    "user": { "type": "string", "description": "One user of the tenant; absent: the whole tenant." } } } } } } }))),
        "delete": op("unblock", "Lift the block of the tenant, or of one user (?user=)", written(), &stale,
            json!({ "parameters": [tenant, if_match(), query("user", false, "The user whose block to lift.")] })),
    }));
    paths.insert("/admin/v1/history".into(), json!({ "get": op("history", "Every configuration change, newest first",
        returns("The audit entries.", "History"), &[], json!({ "parameters": [query("limit", false, "Entries, 100 by default.")] })) }));
}

/// The ledger's and the tenants' routes.
fn ledger(paths: &mut Map<String, Value>) {
    paths.insert("/admin/v1/usage".into(), json!({ "get": op("usage", "A tenant's usage from the ledger (as `ctxbudget usage`)",
        json!({ "description": "The report (or CSV with format=csv).", "content": {
            "application/json": { "schema": schema("UsageReport") }, "text/csv": { "schema": { "type": "string" } } } }),
        &[], json!({ "parameters": [
            query("tenant", true, "The tenant."), query("from", true, "A date (00:00 UTC) or an RFC 3339 time."),
            query("to", true, "Exclusive."), query("user", false, "One of its users."),
            query("model", false, "A model group, or a model its patterns match."),
            query("by", false, "hour, day (default) or month."), query("format", false, "json (default) or csv."),
        ] })) }));
    paths.insert("/admin/v1/reconcile".into(), json!({ "post": op("reconcile", "The provider's usage export against the ledger (as `ctxbudget reconcile`)",
        returns("The comparison, drifted rows flagged.", "ReconcileReport"), &[],
        json!({ "parameters": [
            query("from", true, "A date or an RFC 3339 time on a whole hour."), query("to", true, "Exclusive."),
            query("max_drift", false, "The drift a row may have: 1% by default."),
            query("columns", false, "The export's column names where they differ: hour_start=start_time,…"),
            query("tenant", false, "Only these tenants (comma-separated); every tenant by default."),
        ], "requestBody": { "required": true, "content": { "text/csv": { "schema": { "type": "string" } } } } })) }));
    paths.insert("/admin/v1/tenants".into(), json!({ "get": op("tenants", "Tenants with ledger rows or an override (paged, searched)",
        returns("A page of tenants.", "TenantList"), &[], json!({ "parameters": [
            query("search", false, "Only tenants containing this."), query("offset", false, "Items to skip."),
            query("limit", false, "Items to return: 1 to 1000, 100 by default."),
        ] })) }));
    paths.insert("/admin/v1/tenants/{tenant}".into(), json!({ "get": op("tenant", "One tenant: its status on a tier, users nearest their limits, this month's usage",
        returns("The tenant.", "Tenant"), &[], json!({ "parameters": [
            path_param("tenant", "The tenant."), query("tier", true, "The tier its calls use."),
        ] })) }));
}

/// The console and what it reads.
fn console(paths: &mut Map<String, Value>) {
    paths.insert("/admin/v1/metrics".into(), json!({ "get": op("metrics", "This replica's counters (Prometheus text)",
        json!({ "description": "Prometheus's text format.", "content": { "text/plain": { "schema": { "type": "string" } } } }), &[], json!({})) }));
    paths.insert(
        "/admin/v1/service".into(),
        json!({ "get": op("service", "This replica: store, breaker, configuration version",
        returns("The replica.", "Service"), &[], json!({})) }),
    );
    paths.insert("/console".into(), json!({ "get": { "operationId": "console", "summary": "The console (a page; it asks for an admin token)",
        "tags": ["console"], "security": [], "responses": { "308": { "description": "To /console/." } } } }));
    paths.insert("/console/".into(), json!({ "get": { "operationId": "console-page", "summary": "The console's page",
        "tags": ["console"], "security": [], "responses": { "200": { "description": "HTML.", "content": { "text/html": {} } } } } }));
    paths.insert("/openapi.json".into(), json!({ "get": { "operationId": "openapi", "summary": "This document",
        "tags": ["meta"], "security": [], "responses": { "200": { "description": "OpenAPI 3.1.", "content": { "application/json": {} } } } } }));
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}

/// The admin API's shapes.
pub(super) fn schemas(schemas: &mut Map<String, Value>) {
    let object = |description: &str, properties: Value| json!({ "type": "object", "description": description, "properties": properties });
    let int = json!({ "type": "integer" });
    let text = json!({ "type": "string" });
    schemas.insert("Error".into(), object("An error: what happened and what to do.", json!({ "error": {
        "type": "object", "properties": { "code": int, "status": { "type": "string", "description": "gRPC's name of the code (INVALID_ARGUMENT, …)." }, "message": text } } })));
    schemas.insert("Document".into(), json!({ "type": "object", "description": "A configuration document: a [tiers.<name>], [models.<group>], [prices.<group>], [overrides.<tenant>], [global], [envoy] or [ext_proc] section of the configuration file, as JSON (docs/configuration.md)." }));
    schemas.insert("DocumentList".into(), object("A page of documents.", json!({ "version": int, "total": int, "offset": int,
        "items": { "type": "array", "items": { "type": "object", "properties": { "name": text, "document": schema("Document") } } } })));
    schemas.insert("Written".into(), object("A change as written.", json!({ "field": text, "version": int,
        "old": { "description": "The document before; null when it was created." }, "new": { "description": "The document after; null when deleted." },
        "note": { "type": "string", "description": "What else to know (a block that stays)." } })));
    schemas.insert("History".into(), json!({ "type": "array", "items": object("One change.", json!({
        "id": text, "actor": text, "field": text, "old": text, "new": text, "version": int, "at_ms": int,
        "what": { "type": "string", "enum": ["created", "updated", "deleted", "seeded"] }, "at": text,
        "changes": { "type": "array", "items": text } })) }));
    schemas.insert("UsageReport".into(), object("A usage report (as `ctxbudget usage --json`).", json!({ "tenant": text, "user": text,
        "model_group": text, "from": text, "to": text, "by": text, "grouped": { "type": "boolean" },
        "lines": { "type": "array", "items": { "type": "object" } }, "total": { "type": "object" } })));
    schemas.insert("ReconcileReport".into(), object("A comparison (as `ctxbudget reconcile --json`).", json!({ "from": text, "to": text,
        "max_drift_pct": { "type": "number" }, "tenants": int, "flagged": int, "rows": { "type": "array", "items": { "type": "object" } } })));
    schemas.insert("TenantList".into(), object("A page of tenants.", json!({ "total": int, "items": { "type": "array", "items": {
        "type": "object", "properties": { "tenant": text, "override": { "type": "boolean" }, "blocked": text } } } })));
    schemas.insert("Tenant".into(), object("One tenant.", json!({ "tenant": text, "tier": text, "status": schema("GetStatusResponse"),
        "users": { "type": "array", "items": { "type": "object", "properties": { "user": text, "used": { "type": "number" }, "status": schema("GetStatusResponse") } } },
        "month": schema("UsageReport") })));
    schemas.insert("Service".into(), object("This replica.", json!({ "version": text, "store": text, "breaker": text,
        "live_configuration": { "type": "boolean" }, "config_version": int, "tiers": { "type": "array", "items": text },
        "model_groups": { "type": "array", "items": text } })));
}
