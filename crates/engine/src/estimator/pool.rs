//! Counting off the async executor. A short prompt is counted in place (a few
//! microseconds); a longer one goes to tokio's blocking pool, at most `workers`
//! at a time, so one 256K-token prompt never stalls other requests and a burst of
//! them cannot take every thread.

use super::content;
use super::count::{self, Count, Prompt};
use super::encoding::{Method, ModelRules};
use crate::domain::mix::PromptMix;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Prompts up to this many bytes are counted on the calling task.
pub const INLINE_BYTES: usize = 4096;

/// Counts prompts by the operator's model rules.
pub struct Counter {
    rules: ModelRules,
    permits: Arc<Semaphore>,
}

impl Counter {
    /// A counter running at most `workers` long counts at once.
    pub fn new(rules: ModelRules, workers: usize) -> Self {
        Counter {
            rules,
            permits: Arc::new(Semaphore::new(workers.max(1))),
        }
    }

    /// The model rules.
    pub fn rules(&self) -> &ModelRules {
        &self.rules
    }

    /// Counts `prompt` as `model`'s tokenizer would, stopping above `limit`;
    /// with `mixed`, also splits a count within the limit by content group
    /// (the content-aware correction's input: one more pass over the text).
    pub async fn count(&self, model: &str, prompt: Prompt, limit: u64, mixed: bool) -> Counted {
        let method = self.rules.method(model);
        let run = move |prompt: &Prompt| {
            let count = count::count(method, prompt, limit);
            let mix =
                (mixed && !count.exceeded).then(|| content::mix(method, prompt, count.tokens));
            Counted { count, method, mix }
        };
        if prompt.bytes() <= INLINE_BYTES {
            return run(&prompt);
        }
        let permit = self.permits.clone().acquire_owned().await;
        let counted = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            run(&prompt)
        })
        .await;
        // The blocking task cannot panic short of a bug in the tokenizer; were it
        // to, the prompt is treated as too large rather than as free.
        counted.unwrap_or(Counted {
            count: Count {
                tokens: limit.saturating_add(1),
                exceeded: true,
            },
            method,
            mix: None,
        })
    }
}

/// A prompt counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counted {
    /// The count.
    pub count: Count,
    /// How it was counted.
    pub method: Method,
    /// Its mix, when asked for and within the limit.
    pub mix: Option<PromptMix>,
}
