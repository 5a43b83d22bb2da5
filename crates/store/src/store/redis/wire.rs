//! How numbers and records travel to the scripts and back: little-endian
//! doubles and struct formats (the scripts never parse decimals), the
//! reservation record's tail, and the typed reading of a script's reply.

use crate::domain::budget::ledger::LedgerRetention;
use crate::domain::budget::state::{LevelState, bucket_id};
use crate::domain::budget::{DeniedChecks, Record};
use crate::domain::dimension::{DECLARED_FIRST, Dimension};
use crate::domain::{BucketSpec, DimMap, LevelPlan, ReservePlan};
use crate::store::StoreError;
use redis::{ScriptInvocation, ToRedisArgs, Value};
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

    /// Appends a group of the spec, filled by its positions (`super::spec`).
    pub(super) fn group(&mut self, values: &[f64]) -> &mut Self {
        for v in values {
            self.push(*v);
        }
        self
    }

    /// Appends each bucket of the level ([`Self::bucket`]).
    /// A cost vector: a double per rate dimension, in code order.
    pub(super) fn costs(&mut self, cost: &DimMap<f64>) -> &mut Self {
        for (_, v) in cost.iter() {
            self.push(*v);
        }
        self
    }

    pub(super) fn buckets(&mut self, lp: &LevelPlan) -> &mut Self {
        for spec in &lp.buckets {
            self.bucket(spec);
        }
        self
    }

    /// Appends a bucket's group (`calls::BUCKET`): a rolling bucket's stops
    /// before its window's fields.
    pub(super) fn bucket(&mut self, spec: &BucketSpec) -> &mut Self {
        use super::spec::bucket as b;
        let mut one = [0.0; b::WIDTH];
        one[b::ID] = bucket_id(spec);
        one[b::LIMIT] = spec.limit as f64;
        let used = match spec.window {
            Some(w) => {
                one[b::WINDOW_START] = w.span.start_us as f64;
                one[b::WINDOW_END] = w.span.end_us as f64;
                one[b::WINDOW_NEXT_END] = w.span.next_end_us as f64;
                b::WIDTH
            }
            None => b::WINDOW_START,
        };
        self.group(&one[..used])
    }
}

/// How long ledger rows are kept past their hour and day (µs; 0, 0: no
/// ledger).
pub(super) fn retention_us(ledger: Option<LedgerRetention>) -> (f64, f64) {
    ledger.map_or((0.0, 0.0), |l| (l.hourly_us as f64, l.daily_us as f64))
}

/// A level's overrun credit: its capacity and refill period (µs); 0, 0 for
/// a level that holds the grant.
pub(super) fn overrun(lp: &LevelPlan) -> (f64, f64) {
    lp.overrun
        .map_or((0.0, 0.0), |o| (o.capacity as f64, o.refill_us()))
}

/// The record tail a reserve sends: lease mask, owner tag, fingerprint and a
/// zero settled amount, laid out by [`Record::tail`], then the prompt's mix
/// when it has one (reserve.lua puts it at the record's end).
pub(super) fn record_tail(plan: &ReservePlan) -> Vec<u8> {
    let declared = plan.declared.map(|_, &n| n as f64);
    let mut tail = Record::tail(
        plan.lease_mask(),
        plan.id.owner_tag(),
        plan.fingerprint,
        &declared,
    );
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

/// The declared part of a record at `i` (doubles, one per declared
/// dimension; '' or absent: none).
pub(super) fn declared_at(values: &[Value], i: usize) -> Result<DimMap<u64>, StoreError> {
    let mut out = DimMap::default();
    let bytes = match values.get(i) {
        Some(Value::BulkString(b)) => b.as_slice(),
        _ => return Ok(out),
    };
    for (chunk, d) in bytes
        .chunks_exact(8)
        .zip(&Dimension::RATES[DECLARED_FIRST - 1..])
    {
        let v = f64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        out[*d] = v.max(0.0) as u64;
    }
    Ok(out)
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

/// Where a reserve call's KEYS and ARGV go: the script invocation itself,
/// or one plan's share of a reserve_first call.
pub(in crate::store) trait Call {
    fn key(&mut self, key: String);
    fn arg<T: ToRedisArgs>(&mut self, arg: T);
}

impl Call for ScriptInvocation<'_> {
    fn key(&mut self, key: String) {
        ScriptInvocation::key(self, key);
    }

    fn arg<T: ToRedisArgs>(&mut self, arg: T) {
        ScriptInvocation::arg(self, arg);
    }
}

/// A call's KEYS and ARGV written where `calls.rs` declares each one: every
/// key and argument names its place (0-based: KEYS[1] and ARGV[1] are 0),
/// which debug builds check against those written so far.
pub(in crate::store) struct Args<'a, C: Call> {
    call: &'a mut C,
    next: usize,
    keys: usize,
}

impl<'a, C: Call> Args<'a, C> {
    pub(in crate::store) fn new(call: &'a mut C) -> Self {
        Args {
            call,
            next: 0,
            keys: 0,
        }
    }

    /// Writes `key` at `place` of KEYS.
    pub(in crate::store) fn key(&mut self, place: usize, key: String) -> &mut Self {
        debug_assert_eq!(place, self.keys, "a key out of step with calls.rs");
        self.keys += 1;
        self.call.key(key);
        self
    }

    /// Writes `arg` at `place`.
    pub(in crate::store) fn at<T: ToRedisArgs>(&mut self, place: usize, arg: T) -> &mut Self {
        debug_assert_eq!(place, self.next, "an argument out of step with calls.rs");
        self.next += arg.num_of_args();
        self.call.arg(arg);
        self
    }

    /// The place after the arguments written so far.
    pub(in crate::store) fn next(&self) -> usize {
        self.next
    }
}
