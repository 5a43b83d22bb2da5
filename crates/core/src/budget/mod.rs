//! The budget algorithm: reserve, settle (commit / refund), renew and status
//! as pure functions over level states and reservation records. A store
//! supplies only atomicity and persistence around them: the memory store calls
//! them under its lock; the Lua scripts in `crates/store/lua/` are their port to Redis,
//! given the same [`crate::layout`] by `build.rs` and held to these
//! functions by the differential test (`tests/store/differential/`).
//!
//! - [`state`]: a level's state (buckets, lease count) and its readings.
//! - [`record`]: a reservation's record.
//! - [`level`]: a level as a store holds it (state, leases, expiry).
//! - [`ledger`]: what an operation adds to the usage ledger.
//! - [`reserve`], [`settle`], [`renew`], [`status`], [`charge`]: the operations;
//!   [`usage`]: what a settle is told.
//! - [`replies`]: what they answer (a denial's checks are
//!   [`crate::checks`]).

pub mod alerts;
pub mod calls;
pub mod charge;
pub mod ledger;
pub mod level;
pub mod record;
pub mod renew;
pub mod replies;
pub mod reserve;
pub mod settle;
pub mod state;
pub mod status;
pub mod usage;

pub use crate::checks::DeniedChecks;
pub use charge::{ChargePlan, ChargeReply};
pub use level::{FastMap, Lease, StoredLevel};
pub use record::{BadRecord, Record, RecordState};
pub use replies::{Reclaimed, RenewReply, ReserveReply, Retention, SettleReply, Settled};
pub use reserve::{Earlier, Reserved};
pub use settle::{Deltas, SettleOutcome};
pub use usage::{Settle, Usage};
