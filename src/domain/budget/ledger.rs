//! The usage ledger: what each reservation adds to its tenant's rows, in the
//! same atomic step as the reserve or settle that causes it (`lua/ledger.lua`
//! is the Redis port, prepended to `reserve.lua` and `settle.lua`).
//!
//! A tenant has an hourly row per model group and a daily (UTC) row per user
//! and model group. A reservation enters both when it is taken, as one
//! *unsettled* reservation with its reserved tokens; its Commit or Refund
//! moves it, in the rows of the hour and day it was taken, from unsettled to
//! committed (with the real usage) or refunded. A settle applies once, so a
//! repeated Commit adds nothing; a reservation never settled stays unsettled
//! — once its record is gone (lease + record retention) it lapsed for good.
//! A reservation taken with the ledger off (or by a release before it) enters
//! whole when it settles, in the rows of the settle's hour. A row past its
//! retention (less than [`super::layout::LEDGER_MIN_LIFE_US`] left) is not written.
//!
//! A row is [`LEDGER_FIELDS`] little-endian signed integers of
//! [`LEDGER_INT_BYTES`] bytes (exact below 2^47: 1.4 × 10^14 tokens or µ$ in
//! one hour or day of one tenant and group), in [`Row`]'s field order: 60
//! bytes, within Redis's compact (listpack) hash encoding.

use super::layout::{DAY_US, HOUR_US, LEDGER_FIELDS, LEDGER_INT_BYTES};
use super::record::Record;
use super::usage::Settle;
use crate::domain::UserId;

// lua/ledger.lua spells the ten fields out (a loop cost twice the Redis CPU).
const _: () = assert!(LEDGER_FIELDS == 10, "lua/ledger.lua spells out ten fields");

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
    fn fields(&self) -> [f64; LEDGER_FIELDS] {
        [
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
        ]
    }

    fn from_fields(f: [f64; LEDGER_FIELDS]) -> Row {
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
        ] = f;
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
        }
    }

    /// The row's bytes as the scripts store them: each field's low
    /// [`LEDGER_INT_BYTES`] bytes, little-endian two's complement.
    pub fn encode(&self) -> Vec<u8> {
        self.fields()
            .iter()
            .flat_map(|f| {
                let v = (*f as i64).to_le_bytes();
                v.into_iter().take(LEDGER_INT_BYTES)
            })
            .collect()
    }

    /// Stored bytes back to a row; `None` when they are not a row.
    pub fn decode(bytes: &[u8]) -> Option<Row> {
        if bytes.len() != LEDGER_FIELDS * LEDGER_INT_BYTES {
            return None;
        }
        let mut f = [0.0; LEDGER_FIELDS];
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

/// What taking a reservation of `tokens` at `now_us` adds.
pub fn reserved(now_us: f64, tokens: f64) -> Entry {
    Entry {
        at_us: now_us,
        row: Row {
            unsettled: 1.0,
            reserved_tokens: tokens,
            ..Row::default()
        },
    }
}

/// What settling `rec` by `how` at `now_us` adds: in the rows of the hour it
/// was taken, unsettled becomes committed or refunded; a reservation not in
/// the ledger enters whole, in the rows of now.
pub fn settled(now_us: f64, how: Settle, rec: &Record) -> Entry {
    let mut row = Row::default();
    let at_us = if rec.ledger_at > 0.0 {
        row.unsettled = -1.0;
        rec.ledger_at
    } else {
        row.reserved_tokens = rec.cost;
        now_us
    };
    match how {
        Settle::Refund => row.refunds = 1.0,
        Settle::Commit(usage) => {
            let reserved_prompt = rec.cost - rec.output;
            let prompt = usage.prompt as f64;
            row.requests = 1.0;
            row.prompt_tokens = prompt;
            row.cached_prompt_tokens = usage.cached as f64;
            row.completion_tokens = usage.tokens as f64 - prompt;
            row.cost_micros = usage.cost as f64;
            row.prompt_reserved = reserved_prompt;
            row.prompt_error = (reserved_prompt - prompt).abs();
        }
    }
    Entry { at_us, row }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::budget::{RecordState, Usage};

    fn record(ledger_at: f64) -> Record {
        Record {
            state: RecordState::Reserved,
            cost: 1_500.0,
            lease_expires_us: 0.0,
            mask: 0,
            owner: 0,
            fingerprint: 0,
            amount: 0.0,
            estimated: 0.0,
            output: 500.0,
            spend: 0.0,
            ledger_at,
            mix: None,
            learned: None,
        }
    }

    #[test]
    fn a_commit_moves_its_reservation_from_unsettled_to_committed_in_the_hour_it_was_taken() {
        let taken = 1_764_547_200_000_000.0 + 5.0 * HOUR_US + 59.0 * 60e6;
        let mut row = reserved(taken, 1_500.0).row;
        let usage = Usage {
            cached: 300,
            cost: 4_250,
            learn: true,
            ..Usage::new(1_700, 1_100)
        };
        let commit = settled(taken + 2.0 * 60e6, Settle::Commit(usage), &record(taken));
        assert_eq!(commit.at_us, taken, "the rows of the hour it was taken");
        row.add(&commit.row);
        let want = Row {
            requests: 1.0,
            unsettled: 0.0,
            reserved_tokens: 1_500.0,
            prompt_tokens: 1_100.0,
            cached_prompt_tokens: 300.0,
            completion_tokens: 600.0,
            cost_micros: 4_250.0,
            prompt_reserved: 1_000.0,
            prompt_error: 100.0,
            ..Row::default()
        };
        assert_eq!(row, want);
        assert_eq!(Row::decode(&row.encode()), Some(row));
        assert_eq!(row.encode().len(), 60);
        assert_eq!(Row::decode(&row.encode()[..54]), None);
        let signed = Row {
            unsettled: -3.0,
            cost_micros: 1.4e14,
            ..Row::default()
        };
        assert_eq!(Row::decode(&signed.encode()), Some(signed));
    }

    #[test]
    fn a_reservation_outside_the_ledger_enters_whole_when_it_settles() {
        let now = 1_764_547_200_000_000.0;
        let refund = settled(now, Settle::Refund, &record(0.0));
        assert_eq!(refund.at_us, now);
        assert_eq!(
            refund.row,
            Row {
                refunds: 1.0,
                reserved_tokens: 1_500.0,
                ..Row::default()
            }
        );
    }

    #[test]
    fn periods_are_utc_hours_and_days_and_rows_expire_after_their_retention() {
        // 2025-12-01T23:30:00Z
        let at = 1_764_631_800_000_000.0;
        let (hour, day) = Period::of(at);
        assert_eq!(hour.start_us(), 1_764_630_000_000_000);
        assert_eq!(day.start_us(), 1_764_547_200_000_000);
        let keep = LedgerRetention {
            hourly_us: 10,
            daily_us: 20,
        };
        assert_eq!(hour.expires_us(keep), 1_764_633_600_000_010);
        assert_eq!(day.expires_us(keep), 1_764_633_600_000_020);
    }
}
