//! Which tokenizer counts a model's prompts, and how: the model → encoding
//! table, the models counted with the fast heuristic, and the estimator key a
//! model's samples are kept under — taken from the rules, never from the
//! caller's model name, so the keys are as few as the rules say.

use serde::{Deserialize, Serialize};

/// A BPE vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// gpt-4o, gpt-4.1, gpt-4.5, gpt-5 and the o-series.
    #[serde(rename = "o200k_base")]
    O200kBase,
    /// gpt-4, gpt-3.5-turbo and the text-embedding-3 family.
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
}

impl Encoding {
    /// The encoding's name, as tiktoken calls it.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    /// The encoding OpenAI's models use; `None` for models of other vendors.
    pub fn for_openai_model(model: &str) -> Option<Self> {
        table_row(model).map(|(_, e)| *e)
    }
}

/// The built-in tokenizer table: model-name prefixes (matched without case,
/// after an optional `openai/`) and their encoding, the longer prefixes of a
/// family first (`gpt-4o` before `gpt-4`). Each row is also an estimator key:
/// every model it matches pools its samples under the prefix.
pub const TABLE: [(&str, Encoding); 14] = [
    ("gpt-4o", Encoding::O200kBase),
    ("chatgpt-4o", Encoding::O200kBase),
    ("gpt-4.1", Encoding::O200kBase),
    ("gpt-4.5", Encoding::O200kBase),
    ("gpt-5", Encoding::O200kBase),
    ("o1", Encoding::O200kBase),
    ("o3", Encoding::O200kBase),
    ("o4", Encoding::O200kBase),
    ("gpt-oss", Encoding::O200kBase),
    ("gpt-4", Encoding::Cl100kBase),
    ("gpt-3.5", Encoding::Cl100kBase),
    ("text-embedding-3", Encoding::Cl100kBase),
    ("text-embedding-ada-002", Encoding::Cl100kBase),
    ("gpt-35-turbo", Encoding::Cl100kBase),
];

/// The first row of [`TABLE`] that `model` matches.
fn table_row(model: &str) -> Option<&'static (&'static str, Encoding)> {
    let m = model.to_ascii_lowercase();
    let m = m.strip_prefix("openai/").unwrap_or(&m);
    TABLE.iter().find(|(prefix, _)| m.starts_with(prefix))
}

/// How a model's prompts are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// With the BPE tokenizer.
    Exact(Encoding),
    /// With the calibrated character-class heuristic for that encoding.
    Fast(Encoding),
}

impl Method {
    /// The encoding behind the count.
    pub fn encoding(self) -> Encoding {
        match self {
            Method::Exact(e) | Method::Fast(e) => e,
        }
    }

    /// `exact` or `fast`, for metrics.
    pub fn kind(self) -> &'static str {
        match self {
            Method::Exact(_) => "exact",
            Method::Fast(_) => "fast",
        }
    }
}

/// A model-name pattern: an exact name, or a prefix ending in `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Parses `gpt-4o` or `claude-*`.
    pub fn new(text: &str) -> Self {
        Pattern(text.to_ascii_lowercase())
    }

    /// The pattern as parsed (lower case): the estimator key of a fast-path pattern.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True when `model` matches.
    pub fn matches(&self, model: &str) -> bool {
        let model = model.to_ascii_lowercase();
        match self.0.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => model == self.0,
        }
    }
}

/// The operator's rules for models.
#[derive(Clone, Debug)]
pub struct ModelRules {
    /// Encoding for models that are not OpenAI's (deepseek-*, claude-*, gemini-*...).
    pub default_encoding: Encoding,
    /// Models counted with the fast heuristic.
    pub fast: Vec<Pattern>,
    /// Models whose samples share one estimator key: (pattern, key), first match wins.
    pub groups: Vec<(Pattern, String)>,
}

impl Default for ModelRules {
    fn default() -> Self {
        ModelRules {
            default_encoding: Encoding::O200kBase,
            fast: Vec::new(),
            groups: Vec::new(),
        }
    }
}

impl ModelRules {
    /// How `model`'s prompts are counted.
    pub fn method(&self, model: &str) -> Method {
        let encoding = Encoding::for_openai_model(model).unwrap_or(self.default_encoding);
        if self.fast.iter().any(|p| p.matches(model)) {
            Method::Fast(encoding)
        } else {
            Method::Exact(encoding)
        }
    }

    /// The estimator key of `model`, a pure function of the model and these
    /// rules, never the caller's text itself: the first `groups` pattern that
    /// matches gives its key; else the `fast` pattern that matches is the key
    /// (heuristic errors are learned apart from exact ones); else the row of
    /// the built-in [`TABLE`] (`gpt-4o-mini` → `gpt-4o`); else every other
    /// model shares its encoding's key (`o200k_base`). So the keys in the
    /// store, the metric labels and the refresh work are bounded by
    /// [`ModelRules::keys`], whatever model names callers send.
    pub fn estimator_key(&self, model: &str) -> &str {
        if let Some((_, key)) = self.groups.iter().find(|(p, _)| p.matches(model)) {
            return key;
        }
        if let Some(p) = self.fast.iter().find(|p| p.matches(model)) {
            return p.as_str();
        }
        match table_row(model) {
            Some((prefix, _)) => prefix,
            None => self.default_encoding.as_str(),
        }
    }

    /// Every estimator key these rules can give, sorted: the bound on
    /// estimator keys.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.groups.iter().map(|(_, k)| k.as_str()).collect();
        keys.extend(self.fast.iter().map(Pattern::as_str));
        keys.extend(TABLE.iter().map(|(prefix, _)| *prefix));
        keys.push(self.default_encoding.as_str());
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// Longest estimator key (a group's key or a fast-path pattern), in bytes:
/// reservation ids carry the key, so it stays short.
pub const MAX_KEY_BYTES: usize = 64;

/// Checks an estimator key or pattern from the configuration: 1 to
/// [`MAX_KEY_BYTES`] bytes, no control characters.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "{key:?} is {} bytes; estimator keys and patterns have 1-{MAX_KEY_BYTES}",
            key.len()
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(format!("{key:?} contains a control character"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_openai() {
        let rules = ModelRules::default();
        for m in [
            "gpt-4o",
            "gpt-4o-mini-2024-07-18",
            "gpt-4.1-nano",
            "o3-mini",
            "o1",
            "gpt-5",
        ] {
            assert_eq!(rules.method(m), Method::Exact(Encoding::O200kBase), "{m}");
        }
        for m in [
            "gpt-4",
            "gpt-4-0613",
            "gpt-4-turbo",
            "gpt-3.5-turbo",
            "text-embedding-3-small",
        ] {
            assert_eq!(rules.method(m), Method::Exact(Encoding::Cl100kBase), "{m}");
        }
        for m in ["claude-3-5-sonnet", "deepseek-chat", "gemini-1.5-pro", ""] {
            assert_eq!(rules.method(m), Method::Exact(Encoding::O200kBase), "{m}");
        }
    }

    #[test]
    fn fast_models_and_groups_apply() {
        let rules = ModelRules {
            default_encoding: Encoding::Cl100kBase,
            fast: vec![Pattern::new("claude-*")],
            groups: vec![(Pattern::new("gpt-4o*"), "gpt-4o".into())],
        };
        assert_eq!(
            rules.method("claude-3-opus"),
            Method::Fast(Encoding::Cl100kBase)
        );
        assert_eq!(
            rules.method("Claude-3-Opus"),
            Method::Fast(Encoding::Cl100kBase)
        );
        assert_eq!(rules.estimator_key("gpt-4o-mini"), "gpt-4o");
    }

    #[test]
    fn estimator_keys_come_from_the_rules_never_from_the_name() {
        let rules = ModelRules {
            default_encoding: Encoding::O200kBase,
            fast: vec![Pattern::new("Gemini-*"), Pattern::new("gpt-4o-mini")],
            groups: vec![(Pattern::new("claude-*"), "claude".into())],
        };
        for (model, key) in [
            ("claude-3-opus", "claude"),
            ("gemini-1.5-pro", "gemini-*"),
            ("gpt-4o-mini", "gpt-4o-mini"),
            ("gpt-4o-2024-08-06", "gpt-4o"),
            ("OpenAI/GPT-4o", "gpt-4o"),
            ("gpt-4-turbo", "gpt-4"),
            ("gpt-4.1-nano", "gpt-4.1"),
            ("o3-mini", "o3"),
            ("deepseek-chat", "o200k_base"),
            ("x7f3a9", "o200k_base"),
            ("", "o200k_base"),
        ] {
            assert_eq!(rules.estimator_key(model), key, "{model}");
            assert!(rules.keys().contains(&key), "{key} is listed");
        }
        assert_eq!(
            rules.keys().len(),
            TABLE.len() + 4,
            "rows, group, fast patterns, encoding"
        );
        assert!(check_key("claude").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(check_key("a\nb").is_err());
    }
}
