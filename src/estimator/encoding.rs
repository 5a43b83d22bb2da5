//! Which tokenizer counts a model's prompts, and how: the model → encoding
//! table, the models counted with the fast heuristic, and the estimator key a
//! model's samples are kept under.

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
        let m = model.to_ascii_lowercase();
        let m = m.strip_prefix("openai/").unwrap_or(&m);
        const O200K: [&str; 9] = [
            "gpt-4o",
            "chatgpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "o1",
            "o3",
            "o4",
            "gpt-oss",
        ];
        const CL100K: [&str; 5] = [
            "gpt-4",
            "gpt-3.5",
            "text-embedding-3",
            "text-embedding-ada-002",
            "gpt-35-turbo",
        ];
        if O200K.iter().any(|p| m.starts_with(p)) {
            Some(Encoding::O200kBase)
        } else if CL100K.iter().any(|p| m.starts_with(p)) {
            Some(Encoding::Cl100kBase)
        } else {
            None
        }
    }
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

    /// The estimator key of `model`: its group, or the model itself.
    pub fn estimator_key<'a>(&'a self, model: &'a str) -> &'a str {
        self.groups
            .iter()
            .find(|(p, _)| p.matches(model))
            .map_or(model, |(_, key)| key.as_str())
    }
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
        assert_eq!(rules.estimator_key("gemini-pro"), "gemini-pro");
    }
}
