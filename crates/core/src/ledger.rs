//! The usage ledger's rows: what a tenant's hourly and daily rows sum, how a
//! row is stored, and which row a time falls in. What each operation adds to
//! them is [`crate::budget::ledger`]'s.
//!
//! A tenant has an hourly row per model group and a daily (UTC) row per user
//! and model group. A row is [`LEDGER_FIELDS`] little-endian signed integers of
//! [`LEDGER_INT_BYTES`] bytes (exact below 2^47: 1.4 × 10^14 tokens or µ$ in
//! one hour or day of one tenant and group), in [`Row`]'s field order: 60
//! bytes, within Redis's compact (listpack) hash encoding. A row that has
//! counted cache writes, reasoning tokens or a declared dimension (images)
//! carries them in [`LEDGER_PARTS`] more and one per declared dimension:
//! only the hashes of tenants whose calls report those pay the larger
//! encoding, and rows written before those columns existed read as none.

use crate::dimension::{DECLARED_COUNT, DECLARED_FIRST, Dimension};
use crate::layout::{DAY_US, HOUR_US, LEDGER_FIELDS, LEDGER_INT_BYTES, LEDGER_PARTS};
use crate::{DimMap, UserId};

/// The fields a row names (then the declared dimensions').
const NAMED: usize = LEDGER_FIELDS + LEDGER_PARTS;

// crates/store/lua/ledger.lua spells the ten fields out (a loop cost twice the Redis CPU).
const _: () = assert!(
    LEDGER_FIELDS == 10,
    "crates/store/lua/ledger.lua spells out ten fields"
);
const _: () = assert!(LEDGER_PARTS == 3, "settle.lua writes three named parts");

/// The fields of a row with its parts: the named parts, then what was
/// used of each dimension the caller counts (images), in code order. A row
/// stored with fewer parts (before a dimension existed) reads as 0 in those.
const LONG: usize = LEDGER_FIELDS + LEDGER_PARTS + DECLARED_COUNT;

/// One ledger row: the sums over the reservations it covers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Row {
    /// Reservations committed (calls that reached the upstream).
    pub requests: f64,
    /// Reservations refunded.
    pub refunds: f64,
    /// Reservations taken and not settled (yet, or ever: lapsed).
    pub unsettled: f64,
    /// Tokens reserved (prompt + granted output), every reservation.
    pub reserved_tokens: f64,
    /// Prompt tokens committed, cached ones included.
    pub prompt_tokens: f64,
    /// Of which cached.
    pub cached_prompt_tokens: f64,
    /// Completion tokens committed.
    pub completion_tokens: f64,
    /// What the committed usage cost, µ$.
    pub cost_micros: f64,
    /// The prompt reserved for the committed reservations (the estimate, or
    /// the caller's count).
    pub prompt_reserved: f64,
    /// Σ |prompt reserved − prompt committed| over the committed reservations:
    /// the estimator's error.
    pub prompt_error: f64,
    /// Of the prompt tokens, written to the provider's cache for 5 minutes.
    pub cache_write_prompt_tokens: f64,
    /// Of the prompt tokens, written to the provider's cache for an hour.
    pub cache_write_1h_prompt_tokens: f64,
    /// Of the completion tokens, reasoning.
    pub reasoning_tokens: f64,
    /// What the committed calls used in each dimension the caller counts.
    pub declared: DimMap<f64>,
}

/// One row as a report reads it: its model group ("": none), its user (daily
/// rows; `None` on hourly rows and for requests with no user), and the sums.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerRow {
    /// The model group ("": none).
    pub group: String,
    /// The user, on a daily row of a request that named one.
    pub user: Option<UserId>,
    /// The sums.
    pub row: Row,
}

/// What one operation adds to the ledger, and the time whose hour and day
/// rows take it (µs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    /// The time its rows are for.
    pub at_us: f64,
    /// What it adds.
    pub row: Row,
}

/// How long ledger rows are kept past the end of their hour or day (µs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerRetention {
    /// Hourly rows.
    pub hourly_us: i64,
    /// Daily rows.
    pub daily_us: i64,
}

/// Which row of a tenant: its hour (or day) number since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Period {
    /// Hours since the epoch.
    Hour(i64),
    /// UTC days since the epoch.
    Day(i64),
}

impl Period {
    /// The hour and the day `at_us` falls in.
    pub fn of(at_us: f64) -> (Period, Period) {
        let hour = (at_us - at_us.rem_euclid(HOUR_US)) / HOUR_US;
        let day = (at_us - at_us.rem_euclid(DAY_US)) / DAY_US;
        (Period::Hour(hour as i64), Period::Day(day as i64))
    }

    /// When the period starts (µs).
    pub fn start_us(self) -> i64 {
        match self {
            Period::Hour(h) => h * HOUR_US as i64,
            Period::Day(d) => d * DAY_US as i64,
        }
    }

    /// When a row of this period expires, kept `retention` past its end (µs).
    pub fn expires_us(self, retention: LedgerRetention) -> i64 {
        match self {
            Period::Hour(h) => (h + 1) * HOUR_US as i64 + retention.hourly_us,
            Period::Day(d) => (d + 1) * DAY_US as i64 + retention.daily_us,
        }
    }
}

impl Row {
    /// The fields in their stored order.
    fn fields(&self) -> [f64; LONG] {
        let mut out = [0.0; LONG];
        let named = [
            self.requests,
            self.refunds,
            self.unsettled,
            self.reserved_tokens,
            self.prompt_tokens,
            self.cached_prompt_tokens,
            self.completion_tokens,
            self.cost_micros,
            self.prompt_reserved,
            self.prompt_error,
            self.cache_write_prompt_tokens,
            self.cache_write_1h_prompt_tokens,
            self.reasoning_tokens,
        ];
        out[..NAMED].copy_from_slice(&named);
        out[NAMED..].copy_from_slice(self.declared.declared());
        out
    }

    fn from_fields(f: [f64; LONG]) -> Row {
        let mut declared = DimMap::default();
        for (d, v) in Dimension::RATES[DECLARED_FIRST - 1..]
            .iter()
            .zip(&f[NAMED..])
        {
            declared[*d] = *v;
        }
        let named: [f64; NAMED] = f[..NAMED].try_into().expect("the named fields");
        let [
            requests,
            refunds,
            unsettled,
            reserved_tokens,
            prompt_tokens,
            cached_prompt_tokens,
            completion_tokens,
            cost_micros,
            prompt_reserved,
            prompt_error,
            cache_write_prompt_tokens,
            cache_write_1h_prompt_tokens,
            reasoning_tokens,
        ] = named;
        Row {
            requests,
            refunds,
            unsettled,
            reserved_tokens,
            prompt_tokens,
            cached_prompt_tokens,
            completion_tokens,
            cost_micros,
            prompt_reserved,
            prompt_error,
            cache_write_prompt_tokens,
            cache_write_1h_prompt_tokens,
            reasoning_tokens,
            declared,
        }
    }

    /// Whether the row has counted a part (cache writes, reasoning, a
    /// declared dimension): it is stored with them.
    fn has_parts(&self) -> bool {
        self.fields()[LEDGER_FIELDS..].iter().any(|v| *v != 0.0)
    }

    /// The row's bytes as the scripts store them: each field's low
    /// [`LEDGER_INT_BYTES`] bytes, little-endian two's complement; the parts
    /// only when the row has any.
    pub fn encode(&self) -> Vec<u8> {
        let n = match self.has_parts() {
            true => LONG,
            false => LEDGER_FIELDS,
        };
        self.fields()[..n]
            .iter()
            .flat_map(|f| {
                let v = (*f as i64).to_le_bytes();
                v.into_iter().take(LEDGER_INT_BYTES)
            })
            .collect()
    }

    /// Stored bytes back to a row (a row without parts reads as none);
    /// `None` when they are not a row.
    pub fn decode(bytes: &[u8]) -> Option<Row> {
        // Any length from no parts to all of them: a row stored before a
        // part existed reads as 0 in it.
        let fields = bytes.len() / LEDGER_INT_BYTES;
        if !bytes.len().is_multiple_of(LEDGER_INT_BYTES)
            || !(fields == LEDGER_FIELDS || (LEDGER_FIELDS + LEDGER_PARTS..=LONG).contains(&fields))
        {
            return None;
        }
        let mut f = [0.0; LONG];
        for (v, chunk) in f.iter_mut().zip(bytes.chunks_exact(LEDGER_INT_BYTES)) {
            // Sign-extend the low bytes to 8.
            let fill = if chunk[LEDGER_INT_BYTES - 1] & 0x80 != 0 {
                0xff
            } else {
                0
            };
            let mut word = [fill; 8];
            word[..LEDGER_INT_BYTES].copy_from_slice(chunk);
            *v = i64::from_le_bytes(word) as f64;
        }
        Some(Row::from_fields(f))
    }

    /// Adds `other` field by field.
    pub fn add(&mut self, other: &Row) {
        let (mut a, b) = (self.fields(), other.fields());
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
        *self = Row::from_fields(a);
    }
}
