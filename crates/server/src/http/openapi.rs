//! The OpenAPI 3.1 description of the HTTP listener, built at run time and
//! served at `/openapi.json` (`docs/openapi.json` is a copy, regenerated with
//! `ctxbudget openapi`; a test fails when they part). The budget messages'
//! schemas are made from the proto's own descriptors — protobuf's JSON
//! mapping: lowerCamelCase names, enums by name, 64-bit integers as strings
//! (or numbers) — with the proto's comments as descriptions, so they cannot
//! drift from the proto.

use super::openapi_parts::{errors, returns, schema};
use crate::pb;
use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorProto, FileDescriptorSet};
use serde_json::{Map, Value, json};

/// The RPCs as served: path, request and response message.
pub const RPCS: [(&str, &str, &str); 6] = [
    (
        "check-and-reserve",
        "CheckAndReserveRequest",
        "CheckAndReserveResponse",
    ),
    ("commit", "CommitRequest", "CommitResponse"),
    ("refund", "RefundRequest", "RefundResponse"),
    ("renew-lease", "RenewLeaseRequest", "RenewLeaseResponse"),
    ("get-status", "GetStatusRequest", "GetStatusResponse"),
    (
        "get-estimator",
        "GetEstimatorRequest",
        "GetEstimatorResponse",
    ),
];

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (path, request, response) in RPCS {
        paths.insert(format!("/v1/{path}"), rpc(path, request, response));
    }
    super::openapi_admin::paths(&mut paths);
    let mut schemas = proto_schemas();
    super::openapi_admin::schemas(&mut schemas);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ctxbudget HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Every BudgetService RPC as POST /v1/<rpc> in protobuf's JSON mapping, \
                the admin API under /admin/v1/ and the console at /console. Bearer tokens as on \
                gRPC; the admin API takes tokens of role \"admin\". See docs/http-api.md.",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

fn rpc(path: &str, request: &str, response: &str) -> Value {
    let mut responses = Map::new();
    responses.insert("200".into(), returns("The RPC's response.", response));
    responses.extend(errors(&[
        (
            "400",
            "Not a request in protobuf's JSON mapping, or a field in error; nothing changed.",
        ),
        ("401", "No bearer token, or not a configured one."),
        ("403", "The token is bound to other tenants."),
        ("404", "The reservation is unknown or long gone."),
        (
            "409",
            "The state forbids it (an idempotency key spent on another request).",
        ),
        ("413", "The body is larger than [server] max_message_bytes."),
        (
            "503",
            "The store cannot answer: retry, or apply the gateway's fail-open/closed policy.",
        ),
    ]));
    if path == "check-and-reserve" {
        let either = |why: &str| {
            json!({ "description": why, "content": { "application/json": {
                "schema": { "oneOf": [schema(response), schema("Error")] } } } })
        };
        responses.insert("429".into(), either("Denied by a rate, budget or concurrency limit (the response, with `Retry-After` and `x-ratelimit-*`: docs/http.md); or shed by the admission gate (an Error, with `Retry-After`)."));
        responses.insert("413".into(), either("Denied: the request can never fit (the response); or the body is larger than [server] max_message_bytes (an Error)."));
        responses.insert("403".into(), either("Denied: blocked by an operator (the response); or the token is bound to other tenants (an Error)."));
    }
    json!({
        "post": {
            "operationId": pascal(path),
            "summary": format!("{} (the gRPC RPC, in JSON)", pascal(path)),
            "tags": ["budget"],
            "requestBody": {
                "required": false,
                "content": { "application/json": { "schema": schema(request) } },
            },
            "responses": responses,
        }
    })
}

/// `check-and-reserve` → `CheckAndReserve`.
fn pascal(kebab: &str) -> String {
    kebab
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map_or(String::new(), |f| f.to_uppercase().chain(c).collect())
        })
        .collect()
}

/// Every message and enum of `ctxbudget.v1` as a JSON schema.
fn proto_schemas() -> Map<String, Value> {
    let set = FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET)
        .expect("the built-in descriptors decode");
    let mut out = Map::new();
    for file in set.file.iter().filter(|f| f.package() == "ctxbudget.v1") {
        for (i, e) in file.enum_type.iter().enumerate() {
            let names: Vec<&str> = e.value.iter().map(|v| v.name()).collect();
            let mut s = json!({ "type": "string", "enum": names });
            if let Some(d) = comment(file, &[5, i as i32]) {
                s["description"] = d.into();
            }
            out.insert(e.name().into(), s);
        }
        for (i, m) in file.message_type.iter().enumerate() {
            out.insert(m.name().into(), message(file, m, i));
        }
    }
    out
}

fn message(file: &FileDescriptorProto, m: &DescriptorProto, index: usize) -> Value {
    let mut properties = Map::new();
    for (j, f) in m.field.iter().enumerate() {
        let mut s = match f.r#type() {
            Type::Double | Type::Float => json!({ "type": "number" }),
            Type::Int64 | Type::Uint64 | Type::Sint64 | Type::Fixed64 | Type::Sfixed64 => {
                json!({ "type": ["string", "integer"], "format": "int64" })
            }
            Type::Int32 | Type::Uint32 | Type::Sint32 | Type::Fixed32 | Type::Sfixed32 => {
                json!({ "type": "integer", "format": "int32" })
            }
            Type::Bool => json!({ "type": "boolean" }),
            Type::String => json!({ "type": "string" }),
            Type::Bytes => json!({ "type": "string", "format": "byte" }),
            Type::Enum | Type::Message | Type::Group => {
                schema(f.type_name().rsplit('.').next().unwrap_or_default())
            }
        };
        if f.label() == Label::Repeated {
            s = json!({ "type": "array", "items": s });
        }
        if let Some(d) = comment(file, &[4, index as i32, 2, j as i32]) {
            s = match s.get("$ref") {
                // A reference takes no siblings in older tools: wrap it.
                Some(_) => json!({ "allOf": [s], "description": d }),
                None => {
                    s["description"] = d.into();
                    s
                }
            };
        }
        let name = match f.json_name() {
            "" => lower_camel(f.name()),
            n => n.to_string(),
        };
        properties.insert(name, s);
    }
    let mut out = json!({
        "type": "object",
        "description": "Field names in lowerCamelCase, or the proto's own; every field may be left out (its default).",
        "properties": properties,
    });
    if let Some(d) = comment(file, &[4, index as i32]) {
        out["description"] = d.into();
    }
    out
}

/// `tenant_id` → `tenantId`.
fn lower_camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match (c, upper) {
            ('_', _) => upper = true,
            (c, true) => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            (c, false) => out.push(c),
        }
    }
    out
}

/// The leading comment of the element at `path` (descriptor.proto's
/// source-location path), one paragraph.
fn comment(file: &FileDescriptorProto, path: &[i32]) -> Option<String> {
    let info = file.source_code_info.as_ref()?;
    let location = info.location.iter().find(|l| l.path == path)?;
    let text = location.leading_comments().trim();
    (!text.is_empty()).then(|| text.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_json_mapping() {
        assert_eq!(
            lower_camel("cache_write_1h_prompt_tokens"),
            "cacheWrite1hPromptTokens"
        );
        assert_eq!(pascal("check-and-reserve"), "CheckAndReserve");
        let doc = document();
        let request = &doc["components"]["schemas"]["CheckAndReserveRequest"]["properties"];
        assert!(request["tenantId"].is_object(), "{request}");
        assert_eq!(request["maxOutputTokens"]["format"], "int64");
        let reason = &doc["components"]["schemas"]["Reason"]["enum"];
        assert!(
            reason
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == "REASON_RPM_EXCEEDED")
        );
    }
}
