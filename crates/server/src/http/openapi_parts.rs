//! The pieces every part of the OpenAPI document is made of: a schema
//! reference, a JSON answer, the error answers.

use serde_json::{Map, Value, json};

/// The reference to schema `name`.
pub(super) fn schema(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// A JSON response of schema `name`.
pub(super) fn returns(description: &str, name: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": schema(name) } } })
}

/// The errors every route may answer.
pub(super) fn errors(codes: &[(&str, &str)]) -> Map<String, Value> {
    let mut out = Map::new();
    for (code, why) in codes {
        out.insert((*code).into(), returns(why, "Error"));
    }
    out
}
