//! How numbers and records travel to the scripts and back: little-endian
//! doubles and struct formats (the scripts never parse decimals), the
//! reservation record's tail, and the typed reading of a script's reply.

use crate::domain::budget::ledger::LedgerRetention;
use crate::domain::budget::state::{LevelState, bucket_id};
use crate::domain::budget::{DeniedChecks, Record};
use crate::domain::{LevelPlan, ReservePlan};
use crate::store::StoreError;
use redis::Value;
use std::borrow::Cow;

/// `'<'` and enough `'d'`s for any spec or state: scripts slice struct formats from it.
pub(super) const DOUBLES: &str = concat!(
    "<dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
    "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
    "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd",
    "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
);

/// The struct format of `n` doubles: a slice of [`DOUBLES`], or — for a plan
/// of more buckets than it covers (up to 4 levels of 81) — one made.
pub(super) fn doubles(n: usize) -> Cow<'static, str> {
    match DOUBLES.get(..n + 1) {
        Some(format) => Cow::Borrowed(format),
        None => Cow::Owned(format!("<{}", "d".repeat(n))),
    }
}

/// Little-endian doubles, the way every script takes its numbers.
#[derive(Default)]
pub(super) struct Spec(pub(super) Vec<u8>);

impl Spec {
    pub(super) fn push(&mut self, v: f64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn count(&self) -> usize {
        self.0.len() / 8
    }

    /// Appends how long ledger rows are kept past their hour and day (µs;
    /// 0, 0: no ledger).
    pub(super) fn ledger(&mut self, ledger: Option<LedgerRetention>) -> &mut Self {
        let (hourly, daily) = ledger.map_or((0, 0), |l| (l.hourly_us, l.daily_us));
        self.push(hourly as f64).push(daily as f64)
    }

    /// Appends the level's overrun credit: its capacity and refill period
    /// (µs); 0, 0 for a level that holds the grant.
    pub(super) fn overrun(&mut self, lp: &LevelPlan) -> &mut Self {
        let (capacity, refill_us) = lp
            .overrun
            .map_or((0.0, 0.0), |o| (o.capacity as f64, o.refill_us()));
        self.push(capacity).push(refill_us)
    }

    /// Appends `id, limit` per bucket, and a calendar window's boundaries
    /// (start, end, next end) after its limit.
    pub(super) fn buckets(&mut self, lp: &LevelPlan) -> &mut Self {
        for b in &lp.buckets {
            self.push(bucket_id(b)).push(b.limit as f64);
            if let Some(w) = b.window {
                self.push(w.span.start_us as f64)
                    .push(w.span.end_us as f64)
                    .push(w.span.next_end_us as f64);
            }
        }
        self
    }
}

/// The record tail a reserve sends: lease mask, owner tag, fingerprint and a
/// zero settled amount, laid out by [`Record::tail`], then the prompt's mix
/// when it has one (reserve.lua puts it at the record's end).
pub(super) fn record_tail(plan: &ReservePlan) -> Vec<u8> {
    let mut tail = Record::tail(plan.lease_mask(), plan.id.owner_tag(), plan.fingerprint);
    if let Some(mix) = &plan.prompt_mix {
        tail.extend_from_slice(&mix.to_bytes());
    }
    tail
}

pub(super) fn state_at(values: &[Value], i: usize) -> Result<Option<LevelState>, StoreError> {
    match values.get(i) {
        Some(Value::BulkString(b)) => {
            LevelState::decode(b).map_err(|e| StoreError::Protocol(e.into()))
        }
        other => Err(StoreError::Protocol(
            format!("expected a level state at position {i} of the script reply, got {other:?}")
                .into(),
        )),
    }
}

pub(super) fn int_at(values: &[Value], i: usize) -> Result<i64, StoreError> {
    match values.get(i) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(StoreError::Protocol(
            format!("expected an integer at position {i} of the script reply, got {other:?}")
                .into(),
        )),
    }
}

pub(super) fn string_at(values: &[Value], i: usize) -> Result<String, StoreError> {
    match values.get(i) {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        other => Err(StoreError::Protocol(
            format!("expected a string at position {i} of the script reply, got {other:?}").into(),
        )),
    }
}

/// reserve.lua's mask of denied checks.
pub(super) fn denied_at(values: &[Value], i: usize) -> Result<DeniedChecks, StoreError> {
    match values.get(i) {
        Some(Value::BulkString(b)) => DeniedChecks::from_script(b),
        _ => None,
    }
    .ok_or_else(|| {
        StoreError::Protocol(
            format!("expected the denied checks at position {i} of the script reply").into(),
        )
    })
}

pub(super) fn unexpected(script: &str, tag: i64) -> StoreError {
    StoreError::Protocol(format!("{script}.lua returned the unknown tag {tag}").into())
}
