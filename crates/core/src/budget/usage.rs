//! What a settle is told: the usage the upstream reported (Commit) or none
//! (Refund). The settle operation and the ledger both read it.

use crate::bucket::Cost;
use crate::{DimMap, Dimension};

/// What the upstream reported using, as the buckets count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt + output tokens used.
    pub tokens: u64,
    /// Of which prompt (an estimator sample when the service counted).
    pub prompt: u64,
    /// The prompt tokens input-token limits count: the prompt, less the
    /// cached part where the model group does not count it.
    pub input: u64,
    /// Of the prompt, the tokens the upstream served from its cache (the
    /// ledger reports them).
    pub cached: u64,
    /// Of the prompt, the tokens written to the upstream's cache for 5
    /// minutes (the ledger reports them).
    pub cache_write: u64,
    /// Of the prompt, written to the cache for an hour (the ledger reports them).
    pub cache_write_1h: u64,
    /// Of the completion, reasoning tokens (the ledger reports them).
    pub reasoning: u64,
    /// What the usage cost at the model group's price, µ$.
    pub cost: u64,
    /// In each dimension the caller counts ([`Dimension::is_declared`]),
    /// what the call used.
    pub declared: DimMap<u64>,
    /// `prompt` is the upstream's own count, so it teaches the estimator; not
    /// when the gateway only knew the prompt as reserved (a stream cut short,
    /// settled with its delivered text).
    pub learn: bool,
    /// Completions kept per (estimator key, tier) when the tier learns its
    /// output (`[estimator] output_window`): this completion is one more
    /// (with `learn`); 0: none kept.
    pub output_kept: usize,
}

impl Usage {
    /// `tokens` used, `prompt` of them prompt, all of the prompt counted as input.
    pub fn new(tokens: u64, prompt: u64) -> Self {
        Usage {
            tokens,
            prompt,
            input: prompt,
            cached: 0,
            cache_write: 0,
            cache_write_1h: 0,
            reasoning: 0,
            cost: 0,
            declared: DimMap::default(),
            learn: true,
            output_kept: 0,
        }
    }
}

impl Usage {
    /// What the usage takes in each dimension: one request, its tokens, the
    /// prompt's input, the completion's output, its cost, and what it
    /// declared. Settling moves each bucket by this less what was reserved.
    pub fn used(&self) -> Cost<f64> {
        DimMap::from_fn(|d| match d {
            Dimension::Requests => 1.0,
            Dimension::Tokens => self.tokens as f64,
            Dimension::InputTokens => self.input as f64,
            Dimension::OutputTokens => self.tokens as f64 - self.prompt as f64,
            Dimension::Spend => self.cost as f64,
            _ => self.declared[d] as f64,
        })
    }
}

/// How to settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The upstream answered with this usage.
    Commit(Usage),
    /// The call failed: nothing was used.
    Refund,
}
