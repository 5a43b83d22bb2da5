//! Parsing what operators write — a tier, an override, the global limits or a
//! whole configuration — as TOML or JSON, with errors that name the field at
//! fault (`tenant.requests[0].limit: invalid value: integer `-5`, expected u64`),
//! and the range check every numeric setting goes through ([`within`]).

use crate::domain::LimitsError;
use serde::de::DeserializeOwned;

/// A document's format, guessed from its first character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Document {
    /// `{ ... }`.
    Json,
    /// Anything else.
    Toml,
}

impl Document {
    /// JSON when the text starts with `{`, TOML otherwise.
    pub fn of(text: &str) -> Self {
        if text.trim_start().starts_with('{') {
            Document::Json
        } else {
            Document::Toml
        }
    }
}

/// A document that does not parse as what it should be: the offending
/// field's path (when there is one) and the parser's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DocumentError(pub String);

/// Parses `text` as a `T`; the error names the offending field's path.
pub fn parse_document<T: DeserializeOwned>(text: &str) -> Result<T, DocumentError> {
    match Document::of(text) {
        Document::Json => {
            let mut de = serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(&mut de).map_err(|e| describe(e.path(), e.inner()))
        }
        Document::Toml => {
            let de = toml::Deserializer::parse(text).map_err(|e| DocumentError(e.to_string()))?;
            serde_path_to_error::deserialize(de).map_err(|e| describe(e.path(), e.inner()))
        }
    }
}

fn describe(path: &serde_path_to_error::Path, error: &impl std::fmt::Display) -> DocumentError {
    let path = path.to_string();
    let text = error.to_string();
    // TOML errors span lines: a position, a source excerpt, then the message.
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let error = match lines.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        [first, .., last] => format!("{last} ({})", first.to_lowercase()),
    };
    DocumentError(if path == "." {
        error
    } else {
        format!("{path}: {error}")
    })
}

/// `field`'s `value` is between `min` and `max`, or the error says so.
pub(super) fn within(field: &str, value: u64, min: u64, max: u64) -> Result<(), LimitsError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(LimitsError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TierSection;

    #[test]
    fn errors_name_the_field_in_toml_and_json() {
        let toml = "max_context_tokens = 1000\ndefault_max_output_tokens = 10\n[user]\nrequests = [{ limit = -5, period = \"1m\" }]\n";
        let err = parse_document::<TierSection>(toml).unwrap_err().to_string();
        assert!(err.starts_with("user.requests[0].limit"), "{err}");
        let json = r#"{"max_context_tokens": 1000, "default_max_output_tokens": 10, "user": {"tokens": [{"limit": "many", "period": "1m"}]}}"#;
        let err = parse_document::<TierSection>(json).unwrap_err().to_string();
        assert!(err.starts_with("user.tokens[0].limit"), "{err}");
        let unknown = "max_context_tokens = 1\ndefault_max_output_tokens = 1\nmax_contxt = 3\n";
        let err = parse_document::<TierSection>(unknown)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_contxt"), "{err}");
    }
}
