//! The usage ledger: what each reservation adds to its tenant's rows, in the
//! same atomic step as the reserve or settle that causes it (`crates/store/lua/ledger.lua`
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
//! retention (less than [`crate::layout::LEDGER_MIN_LIFE_US`] left) is not written.
//!
//! The rows themselves, their format and periods are [`crate::ledger`]'s.

use super::record::Record;
use super::usage::Settle;
pub use crate::ledger::{Entry, LedgerRetention, LedgerRow, Period, Row};

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
            row.cache_write_prompt_tokens = usage.cache_write as f64;
            row.cache_write_1h_prompt_tokens = usage.cache_write_1h as f64;
            row.reasoning_tokens = usage.reasoning as f64;
            row.declared = usage.declared.map(|_, &n| n as f64);
        }
    }
    Entry { at_us, row }
}

#[cfg(test)]
mod tests;
