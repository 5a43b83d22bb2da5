//! A CheckAndReserve's prompt: as the caller gave it (its own count, plain
//! text or chat messages, [`PromptInput`]) and as counted ([`PromptCount`]).
//! The request carries the first; the engine counts it (the estimator does
//! the counting) and plans with the second beside the request.

use super::mix::PromptMix;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// The text.
    pub content: String,
    /// Optional participant name.
    pub name: Option<String>,
}

/// A prompt to count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Plain text.
    Text(String),
    /// Chat messages, counted with the chat format's overhead.
    Messages(Vec<ChatMessage>),
}

impl Prompt {
    /// Bytes of text to count: decides whether counting leaves the executor.
    pub fn bytes(&self) -> usize {
        match self {
            Prompt::Text(t) => t.len(),
            Prompt::Messages(m) => m
                .iter()
                .map(|m| m.role.len() + m.content.len() + m.name.as_ref().map_or(0, String::len))
                .sum(),
        }
    }
}

/// The prompt as the caller gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PromptInput {
    /// The caller's own count, used as is.
    Tokens(u64),
    /// Text or chat messages the service counts.
    Text(Prompt),
}

/// The prompt after counting: what planning, the reservation id and the
/// caller's answer need of it.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptCount {
    /// The prompt's tokens as counted (the caller's count, or the service's
    /// raw count): what the max-context check uses.
    pub tokens: u64,
    /// Set when the service stopped counting early, once the prompt had more
    /// than this many tokens (the tier's max context): `tokens` is then where
    /// counting stopped, not the prompt's size, and a denial says so.
    pub more_than: Option<u64>,
    /// Prompt tokens to reserve: the caller's count, or the service's count
    /// corrected by the adaptive multiplier.
    pub reserve: u64,
    /// The service's raw count, kept for the estimator's samples; 0 when the
    /// caller counted.
    pub estimated: u64,
    /// The estimator key the count belongs to; empty when the caller counted.
    pub estimator: String,
    /// The correction applied to the count (1 for caller counts).
    pub multiplier: f64,
    /// The count's mix, with the content-aware correction.
    pub mix: Option<PromptMix>,
}

impl PromptCount {
    /// The caller's own count, `tokens`: used as is, nothing to learn from.
    pub fn given(tokens: u64) -> Self {
        PromptCount {
            tokens,
            more_than: None,
            reserve: tokens,
            estimated: 0,
            estimator: String::new(),
            multiplier: 1.0,
            mix: None,
        }
    }
}
