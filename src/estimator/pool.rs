//! Counting off the async executor. A short prompt is counted in place (a few
//! microseconds); a longer one goes to tokio's blocking pool, at most `workers`
//! at a time, so one 256K-token prompt never stalls other requests and a burst of
//! them cannot take every thread.

use super::count::{self, Count, Prompt};
use super::encoding::{Method, ModelRules};
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

    /// Counts `prompt` as `model`'s tokenizer would, stopping above `limit`.
    pub async fn count(&self, model: &str, prompt: Prompt, limit: u64) -> (Count, Method) {
        let method = self.rules.method(model);
        if prompt.bytes() <= INLINE_BYTES {
            return (count::count(method, &prompt, limit), method);
        }
        let permit = self.permits.clone().acquire_owned().await;
        let counted = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            count::count(method, &prompt, limit)
        })
        .await;
        // The blocking task cannot panic short of a bug in the tokenizer; were it
        // to, the prompt is treated as too large rather than as free.
        let result = counted.unwrap_or(Count {
            tokens: limit.saturating_add(1),
            exceeded: true,
        });
        (result, method)
    }
}
