//! The numbers and byte layout the budget algorithm and the Lua scripts share,
//! defined once. `build.rs` includes this file and prepends every entry of
//! [`LUA_CONSTANTS`] to each budget script as a Lua `local`, so a change here
//! reaches the Rust algorithm and the scripts together.
//!
//! This file is compiled twice — as part of the crate and inside `build.rs` —
//! so it holds plain constants only and imports nothing.

/// A key's longest life (µs), however deep its debt: 90 days.
pub const MAX_TTL_US: f64 = 7_776_000_000_000.0;
/// Past the life a key needs, it is given as much again plus this (µs), so a
/// hot key rarely needs another PEXPIRE.
pub const TTL_SLACK_US: f64 = 1_000_000.0;
/// Buckets of other configurations (another replica's, mid-rollout) a level
/// state keeps, the most recently used.
pub const MAX_FOREIGN: usize = 16;
/// Reclaimed leases travel packed, [`RECLAIM_BITS`] bits per level (four
/// levels in a double's 53 exact bits); each level's count is capped at this.
pub const RECLAIM_CAP: u64 = (1 << RECLAIM_BITS) - 1;
/// Bits per level of the packed reclaimed-lease count.
pub const RECLAIM_BITS: u32 = 13;
/// Estimator samples live this long past the last one (ms): 30 days.
pub const SAMPLES_TTL_MS: u64 = 2_592_000_000;
/// A sample list (an estimator's prompt samples, a learned output's
/// completions) is trimmed to what is kept, and its life renewed, only when
/// new or this many entries longer: readers take the newest kept, so a Commit
/// mostly pushes alone. Such a list lives [`SAMPLES_TTL_MS`] from its creation
/// or its last trim.
pub const OUTPUT_TRIM_SLACK: usize = 32;
/// The most leases a level may hold for an exact status read to scan it: the
/// scan costs Redis CPU per lease, on one thread.
pub const EXACT_LEASES: u64 = 64;

/// A bucket id is group tag × [`GROUP_SCALE`] + dimension × this + period in
/// seconds, so a script knows a bucket's period and dimension from its id
/// alone (the dimension's digit: `crate::Dimension::code`, which
/// build.rs writes into the scripts' prelude by its `lua_name`).
pub const DIMENSION_SCALE: f64 = 10_000_000.0;
/// The model group's tag (0: all models) is the id's digits from here up.
pub const GROUP_SCALE: f64 = 100_000_000.0;
/// A bucket whose "period" digits are this or more has a calendar window: the
/// digits are this plus the window's tag (kind × 10⁵ + zone digest), and the
/// scripts receive the window's boundaries after its limit.
pub const WINDOW_PERIODS: f64 = 9_000_000.0;

/// A level state is little-endian doubles: this many first (`n` live leases,
/// `e` earliest lease expiry, `x` the key's expiry, and [`STATE_FORMAT`];
/// Lua's `s[1]` to `s[4]`), then [`BUCKET_WIDTH`] per bucket.
pub const STATE_HEAD: usize = 4;
/// Doubles per bucket in a level state: id, level, time of level, and the
/// limit the level was stored under (a change of limit keeps what was used).
pub const BUCKET_WIDTH: usize = 4;
/// The fourth double of a level state: its format. A state without it (its
/// fourth double is a bucket id, at least [`DIMENSION_SCALE`], or absent) was
/// written before buckets kept their limit: [`STATE_HEAD_V1`] doubles, then
/// [`BUCKET_WIDTH_V1`] per bucket, read as this format with every limit
/// unknown (0: the level is taken as stored under the current limit).
pub const STATE_FORMAT: f64 = 2.0;
/// The head of a state written before [`STATE_FORMAT`] existed.
pub const STATE_HEAD_V1: usize = 3;
/// Doubles per bucket in a state written before [`STATE_FORMAT`] existed.
pub const BUCKET_WIDTH_V1: usize = 3;

/// A reservation record, byte by byte (1-based offsets, as Lua's `string.sub`
/// counts): state, cost, lease expiry | lease mask, owner tag, fingerprint,
/// settled amount (the tail the caller sends) | estimated prompt tokens,
/// granted output tokens, spend reserved, time it entered the ledger.
/// Numbers are little-endian doubles, tags little-endian u64.
pub const REC_STATE: usize = 1;
/// Tokens reserved (prompt + granted output).
pub const REC_COST: usize = 2;
/// When the lease lapses (µs).
pub const REC_LEASE_EXPIRY: usize = 10;
/// One byte: bit per level holding a lease.
pub const REC_MASK: usize = 18;
/// Who may settle it: a tag of the reservation id.
pub const REC_OWNER: usize = 19;
/// A hash of the request, to tell an idempotent retry from another request.
pub const REC_FINGERPRINT: usize = 27;
/// Committed: actual − reserved; refunded: tokens returned.
pub const REC_AMOUNT: usize = 35;
/// The service's prompt count (0: the caller counted).
pub const REC_ESTIMATED: usize = 43;
// crates/store/lua/reserve.lua packs the tail before the estimate as 'c25'.
const _: () = assert!(
    REC_ESTIMATED - REC_MASK == 25,
    "crates/store/lua/reserve.lua packs a 25-byte tail"
);
/// The output tokens granted (the rest of the cost is prompt).
pub const REC_OUTPUT: usize = 51;
/// The spend reserved, µ$.
pub const REC_SPEND: usize = 59;
/// When the reservation entered the usage ledger (µs; 0: it did not, the
/// ledger was off).
pub const REC_LEDGER_AT: usize = 67;
/// The record's length in bytes, without a prompt mix.
pub const REC_LEN: usize = 74;
/// The prompt's mix ([`crate::mix::PromptMix`]'s bytes), when the
/// content-aware correction counted it: the record's optional last field,
/// here in a record without a learned output.
pub const REC_MIX: usize = 75;
/// Bytes of a prompt mix: a little-endian `f32` per content group.
pub const MIX_BYTES: usize = 28;
/// The length of a record with a prompt mix.
pub const REC_LEN_MIX: usize = REC_LEN + MIX_BYTES;
/// With a learned output held at some level: one byte, the bit of each
/// level holding it ([`crate::LevelPlan::bit`]); then the learned
/// output ([`REC_LEARNED_OUTPUT`]) and its spend ([`REC_LEARNED_SPEND`]).
/// A prompt mix, if any, follows them: it is always a record's last bytes.
pub const REC_LEARNED_MASK: usize = 75;
/// The output tokens the levels of [`REC_LEARNED_MASK`] hold.
pub const REC_LEARNED_OUTPUT: usize = 76;
/// The spend (µ$) the levels of [`REC_LEARNED_MASK`] hold.
pub const REC_LEARNED_SPEND: usize = 84;
/// The length of a record with a learned output.
pub const REC_LEN_LEARNED: usize = 91;
/// Bytes of a record's learned-output part (mask, output, spend).
pub const REC_LEARNED_BYTES: usize = REC_LEN_LEARNED - REC_LEN;
/// The length of a record with a learned output and a prompt mix.
pub const REC_LEN_LEARNED_MIX: usize = REC_LEN_LEARNED + MIX_BYTES;
/// The length of a record written before [`REC_LEDGER_AT`] existed: read as
/// not in the ledger, so its settlement enters the ledger whole.
pub const REC_LEN_V2: usize = 66;
/// The length of a record written before [`REC_OUTPUT`] existed: read as
/// granted output 0 (all of the cost prompt) and no spend, so reservations
/// made by the previous release settle after an upgrade.
pub const REC_LEN_V1: usize = 50;
/// A usage-ledger row is this many little-endian signed integers of
/// [`LEDGER_INT_BYTES`] each (see `super::ledger::Row`).
pub const LEDGER_FIELDS: usize = 10;
/// A row that has counted cache writes or reasoning tokens stores them in
/// this many more fields (see `super::ledger::Row`).
pub const LEDGER_PARTS: usize = 3;
/// Bytes per ledger field: 6, exact below 2^47 (1.4 × 10^14 tokens or µ$ in
/// one row), so a row (60 bytes) stays within Redis's compact hash encoding.
pub const LEDGER_INT_BYTES: usize = 6;
/// A ledger hour (µs).
pub const HOUR_US: f64 = 3_600_000_000.0;
/// A ledger day (µs): a UTC day.
pub const DAY_US: f64 = 86_400_000_000.0;
/// A ledger row that would expire sooner than this (µs) is not written: it
/// is past its retention (a settlement long after its reservation's hour).
pub const LEDGER_MIN_LIFE_US: f64 = 1_000_000.0;

/// Record state byte: reserved.
pub const STATE_RESERVED: u8 = b'R';
/// Record state byte: committed.
pub const STATE_COMMITTED: u8 = b'C';
/// Record state byte: refunded.
pub const STATE_REFUNDED: u8 = b'F';

/// The first value of reserve.lua's and charge.lua's replies: denied,
/// nothing changed.
pub const REPLY_DENIED: i64 = 0;
/// Reply tag: allowed, taken.
pub const REPLY_ALLOWED: i64 = 1;
/// Reply tag (reserve.lua): an idempotent replay of an earlier reservation.
pub const REPLY_REPLAYED: i64 = 2;
/// Reply tag (reserve.lua): the idempotency key was used for another request.
pub const REPLY_KEY_CONFLICT: i64 = 3;
/// Reply tag (reserve.lua): the idempotency key's reservation was settled or
/// its lease lapsed: nothing to replay.
pub const REPLY_KEY_SPENT: i64 = 4;

/// The first value of settle.lua's and renew.lua's replies: the
/// reservation is unknown (or not this caller's to settle).
pub const REPLY_NOT_FOUND: i64 = -1;
/// Reply tag (settle, renew): settled before; nothing changed.
pub const REPLY_SETTLED_BEFORE: i64 = 0;
/// Reply tag (settle, renew): applied.
pub const REPLY_APPLIED: i64 = 1;
/// Reply tag (renew): the lease had lapsed; nothing renewed.
pub const REPLY_EXPIRED: i64 = 2;

/// Every constant the budget scripts receive, by its Lua name.
pub const LUA_CONSTANTS: &[(&str, f64)] = &[
    ("MAX_TTL", MAX_TTL_US),
    ("TTL_SLACK", TTL_SLACK_US),
    ("MAX_FOREIGN", MAX_FOREIGN as f64),
    ("RECLAIM_CAP", RECLAIM_CAP as f64),
    ("RECLAIM_BITS", RECLAIM_BITS as f64),
    ("SAMPLES_TTL_MS", SAMPLES_TTL_MS as f64),
    ("OUTPUT_TRIM_SLACK", OUTPUT_TRIM_SLACK as f64),
    ("EXACT_LEASES", EXACT_LEASES as f64),
    ("FIRST_BUCKET", (STATE_HEAD + 1) as f64),
    ("BUCKET_WIDTH", BUCKET_WIDTH as f64),
    ("STATE_V", STATE_FORMAT),
    ("HEAD_V1", STATE_HEAD_V1 as f64),
    ("WIDTH_V1", BUCKET_WIDTH_V1 as f64),
    ("DIM", DIMENSION_SCALE),
    ("GROUP", GROUP_SCALE),
    ("WINDOWS", WINDOW_PERIODS),
    ("REC_COST", REC_COST as f64),
    ("REC_LEASE_EXPIRY", REC_LEASE_EXPIRY as f64),
    ("REC_MASK", REC_MASK as f64),
    ("REC_OWNER", REC_OWNER as f64),
    ("REC_FINGERPRINT", REC_FINGERPRINT as f64),
    ("REC_AMOUNT", REC_AMOUNT as f64),
    ("REC_ESTIMATED", REC_ESTIMATED as f64),
    ("REC_OUTPUT", REC_OUTPUT as f64),
    ("REC_SPEND", REC_SPEND as f64),
    ("REC_LEDGER_AT", REC_LEDGER_AT as f64),
    ("REC_LEN", REC_LEN as f64),
    ("REC_MIX", REC_MIX as f64),
    ("REC_LEN_MIX", REC_LEN_MIX as f64),
    ("REC_LEARNED_MASK", REC_LEARNED_MASK as f64),
    ("REC_LEN_LEARNED", REC_LEN_LEARNED as f64),
    ("REC_LEN_LEARNED_MIX", REC_LEN_LEARNED_MIX as f64),
    ("REC_LEARNED_BYTES", REC_LEARNED_BYTES as f64),
    ("MIX_BYTES", MIX_BYTES as f64),
    ("REC_LEN_V2", REC_LEN_V2 as f64),
    ("LEDGER_FIELDS", LEDGER_FIELDS as f64),
    ("LEDGER_PARTS", LEDGER_PARTS as f64),
    ("HOUR_US", HOUR_US),
    ("LEDGER_MIN_LIFE", LEDGER_MIN_LIFE_US),
    ("DAY_US", DAY_US),
    ("REPLY_DENIED", REPLY_DENIED as f64),
    ("REPLY_ALLOWED", REPLY_ALLOWED as f64),
    ("REPLY_REPLAYED", REPLY_REPLAYED as f64),
    ("REPLY_KEY_CONFLICT", REPLY_KEY_CONFLICT as f64),
    ("REPLY_KEY_SPENT", REPLY_KEY_SPENT as f64),
    ("REPLY_NOT_FOUND", REPLY_NOT_FOUND as f64),
    ("REPLY_SETTLED_BEFORE", REPLY_SETTLED_BEFORE as f64),
    ("REPLY_APPLIED", REPLY_APPLIED as f64),
    ("REPLY_EXPIRED", REPLY_EXPIRED as f64),
];

/// Every string constant the budget scripts receive, by its Lua name.
pub const LUA_STRINGS: &[(&str, u8)] = &[
    ("RESERVED", STATE_RESERVED),
    ("COMMITTED", STATE_COMMITTED),
    ("REFUNDED", STATE_REFUNDED),
];

/// The line of every budget script's prelude that reads the time (µs): the
/// server's clock. A store for tests may swap it for a clock it moves by hand.
pub const SERVER_CLOCK: &str =
    "local function clock_us() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end";
