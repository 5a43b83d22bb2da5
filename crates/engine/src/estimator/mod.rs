//! Token estimation: counting prompts with real tokenizers (or a fast
//! character-class heuristic), and the adaptive multiplier that learns from
//! every Commit how far the counts drift per model.
//!
//! - [`encoding`]: which tokenizer a model uses, and which models are counted
//!   with the heuristic.
//! - [`count`]: exact counting (GitHub's `bpe-openai`, checked against
//!   `tiktoken-rs`), the chat format's overhead, early stop at a limit.
//! - [`heuristic`]: the calibrated fast path.
//! - [`adaptive`]: the P95 multiplier, cached per replica and refreshed from the
//!   store.
//! - [`content`]: the content-aware correction: a cost per content group,
//!   fitted on the samples' mixes.
//! - [`output`]: the learned output: a quantile of recent completions per
//!   (estimator key, tier).
//! - [`pool`]: counting off the async executor, on a bounded blocking pool.

pub mod adaptive;
pub mod content;
pub mod count;
pub mod encoding;
pub mod heuristic;
pub mod output;
pub mod pool;

pub use adaptive::{AdaptiveSettings, Correction, Corrector, Multipliers};
pub use count::{ChatMessage, Count, Prompt};
pub use encoding::{Encoding, Method, ModelRules};
pub use pool::Counter;
