//! ctxbudget's core, the budget domain: limits, bucket arithmetic,
//! reservation plans and decisions. The service's crate re-exports it as
//! `ctxbudget::domain`.
//!
//! Pure code: nothing here knows about gRPC or Redis, and this crate's
//! manifest keeps it so — it depends on no runtime, transport or store
//! crate, so an import of one does not compile. [`budget`] is the one
//! algorithm of every store operation; the stores supply atomicity and
//! persistence around it (the memory store calls it, the Lua scripts in `crates/store/lua/`
//! port it to Redis), and the differential test holds the two to one answer.
#![forbid(unsafe_code)]

pub mod alert;
pub mod block;
pub mod bucket;
pub mod budget;
pub mod checks;
pub mod clock;
pub mod decision;
mod denial;
mod digest;
pub mod dimension;
pub mod ids;
pub mod layout;
pub mod ledger;
pub mod level;
pub mod level_plan;
pub mod limits;
pub mod mix;
pub mod model;
pub mod output;
pub mod overrides;
pub mod plan;
pub mod price;
pub mod priority;
pub mod prompt;
pub mod queue;
pub mod reconcile;
pub mod statuses;
/// Every decoder of stored bytes and parser of ids, as one function: the
/// core-only fuzz target's entry (`fuzz/`). Compiled only under `cargo
/// fuzz` (`--cfg fuzzing`) and for the unit tests.
#[cfg(any(fuzzing, test))]
pub mod stored;
pub mod tier;
pub mod usage;
pub mod window;

pub use bucket::BucketSpec;
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Denial, LimitState, Reading, Readings, Reason};
pub use ids::{IdempotencyKey, InvalidInput, ReservationId, SessionId, TenantId, UserId};
pub use level::{DimMap, Dimension, Level};
pub use level_plan::LevelPlan;
pub use limits::Limits;
pub use model::{ModelGroup, ModelGroups};
pub use overrides::{LevelOverride, Override, Setting, ShadowOverride};
pub use plan::ReservePlan;
pub use priority::{Priorities, Priority};
pub use prompt::{ChatMessage, Prompt, PromptCount, PromptInput};
pub use tier::{LevelLimits, LimitsError, ModelLimits, Rate, ShadowLimits, Tier, is_tier_name};
