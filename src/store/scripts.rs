//! The Lua scripts in `lua/`, embedded at build time. Each file opens with its
//! contract (KEYS, ARGV, return value, invariants). The budget scripts come
//! from `build.rs`, which gives each the constants of
//! [`crate::domain::budget::layout`] and the clock as a prelude.

/// Takes a reservation at every level, all or nothing.
pub const RESERVE: &str = include_str!(concat!(env!("OUT_DIR"), "/reserve.lua"));
/// Commits or refunds a reservation.
pub const SETTLE: &str = include_str!(concat!(env!("OUT_DIR"), "/settle.lua"));
/// Extends a live reservation's lease.
pub const RENEW: &str = include_str!(concat!(env!("OUT_DIR"), "/renew.lua"));
/// Reads budgets without writing.
pub const STATUS: &str = include_str!(concat!(env!("OUT_DIR"), "/status.lua"));

/// Changes one configuration document (versioned, audited, announced).
pub const CONFIG_SET: &str = include_str!("../../lua/config_set.lua");
/// Seeds the configuration when Redis holds no tier.
pub const CONFIG_SEED: &str = include_str!("../../lua/config_seed.lua");
