//! The budget algorithm: reserve, settle (commit / refund), renew and status
//! as pure functions over level states and reservation records. A store
//! supplies only atomicity and persistence around them: the memory store calls
//! them under its lock; the Lua scripts in `lua/` are their port to Redis,
//! built on the same [`layout`] and held to these functions by the
//! differential test (`tests/differential.rs`).

pub mod layout;
