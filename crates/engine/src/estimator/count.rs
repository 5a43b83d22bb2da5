//! Counting prompts: exact counts with GitHub's `bpe-openai` (several times
//! faster than `tiktoken-rs` and identical — `tests/tokenizer.rs` holds it to
//! `tiktoken-rs` on fixed vectors), the chat format's overhead, and an early stop
//! once a prompt is known to exceed a limit (the max-context check needs no more).
//!
//! Special-token text such as `<|endoftext|>` in a prompt is counted as the
//! ordinary text it is (`encode_ordinary`): a prompt cannot smuggle control tokens.

use super::encoding::{Encoding, Method};
use super::heuristic;

/// What is counted: the domain's prompt types, re-exported where they are counted.
pub use crate::domain::prompt::{ChatMessage, Prompt};

/// OpenAI's chat format (cookbook `num_tokens_from_messages`, for gpt-3.5-turbo
/// and later): every message costs 3 tokens besides its fields…
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// …a `name` costs 1 more…
pub const TOKENS_PER_NAME: u64 = 1;
/// …and every reply is primed with `<|start|>assistant<|message|>`: 3 tokens.
pub const REPLY_PRIMING: u64 = 3;

/// The result of counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count {
    /// Tokens counted; when `exceeded`, the count stopped somewhere above the limit.
    pub tokens: u64,
    /// The prompt has more than the limit's tokens.
    pub exceeded: bool,
}

fn tokenizer(encoding: Encoding) -> &'static bpe_openai::Tokenizer {
    match encoding {
        Encoding::O200kBase => bpe_openai::o200k_base(),
        Encoding::Cl100kBase => bpe_openai::cl100k_base(),
    }
}

/// Loads the tokenizers (a fraction of a second each), so the first request
/// does not pay for it.
pub fn warm_up() {
    for e in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let _ = tokenizer(e).count("warm up");
    }
}

/// Tokens of `text`, or `None` once they exceed `limit`.
fn text_tokens(method: Method, text: &str, limit: u64) -> Option<u64> {
    match method {
        Method::Exact(e) => {
            let t = tokenizer(e);
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            // Without a useful limit, a plain count avoids the per-piece bookkeeping.
            if text.len() < limit {
                return Some(t.count(text) as u64);
            }
            t.count_till_limit(&t.normalize(text), limit)
                .map(|n| n as u64)
        }
        Method::Fast(e) => Some(heuristic::estimate(e, text)).filter(|&n| n <= limit),
    }
}

/// Counts `prompt` with `method`, stopping once it is known to exceed `limit`.
pub fn count(method: Method, prompt: &Prompt, limit: u64) -> Count {
    let over = |tokens| Count {
        tokens,
        exceeded: true,
    };
    match prompt {
        Prompt::Text(text) => match text_tokens(method, text, limit) {
            Some(tokens) => Count {
                tokens,
                exceeded: false,
            },
            None => over(limit + 1),
        },
        Prompt::Messages(messages) => {
            let mut total = REPLY_PRIMING;
            for m in messages {
                total += TOKENS_PER_MESSAGE;
                let fields = [
                    Some(m.role.as_str()),
                    Some(m.content.as_str()),
                    m.name.as_deref(),
                ];
                for field in fields.into_iter().flatten() {
                    let left = limit.saturating_sub(total);
                    match text_tokens(method, field, left) {
                        Some(n) => total += n,
                        None => return over(limit + 1),
                    }
                }
                if m.name.is_some() {
                    total += TOKENS_PER_NAME;
                }
                if total > limit {
                    return over(total);
                }
            }
            Count {
                tokens: total,
                exceeded: total > limit,
            }
        }
    }
}

/// The reference count: `tiktoken-rs`'s `encode_ordinary`, the same BPE ranks
/// as OpenAI's tiktoken. Tests and benches compare the production counter with it.
pub fn tiktoken_count(encoding: Encoding, text: &str) -> usize {
    let bpe = match encoding {
        Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
        Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
    };
    bpe.encode_ordinary(text).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stop_at_the_limit() {
        let text = "word ".repeat(1000);
        let exact = Method::Exact(Encoding::O200kBase);
        let full = count(exact, &Prompt::Text(text.clone()), u64::MAX);
        assert_eq!(
            full.tokens,
            tiktoken_count(Encoding::O200kBase, &text) as u64
        );
        let capped = count(exact, &Prompt::Text(text.clone()), 100);
        assert!(capped.exceeded && capped.tokens > 100);
        let fits = count(exact, &Prompt::Text(text), full.tokens);
        assert_eq!(fits, full, "a prompt of exactly the limit fits");
    }

    #[test]
    fn special_token_text_is_ordinary_text() {
        let n = count(
            Method::Exact(Encoding::Cl100kBase),
            &Prompt::Text("<|endoftext|>".into()),
            u64::MAX,
        );
        assert!(n.tokens > 1, "counted as text, not as one control token");
    }
}
