//! The ledger's rows: what a reserve and a settle add, and their bytes.

use super::*;
use crate::budget::{RecordState, Usage};
use crate::layout::HOUR_US;
use crate::{DimMap, Dimension};

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
        declared: Default::default(),
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
fn a_row_with_parts_is_longer_and_reads_back_whatever_parts_it_was_stored_with() {
    let taken = 1_764_547_200_000_000.0;
    let usage = Usage {
        cached: 300,
        cost: 4_250,
        ..Usage::new(1_700, 1_100)
    };
    let row = reserved(taken, 1_500.0).row;
    // Cache writes and reasoning make the row longer; rows without them
    // (and rows written before they existed) read as none.
    let parts = Usage {
        cache_write: 200,
        cache_write_1h: 100,
        reasoning: 400,
        declared: DimMap::with([(Dimension::Images, 3)]),
        ..usage
    };
    let mut long = row;
    long.add(&settled(taken, Settle::Commit(parts), &record(taken)).row);
    assert_eq!(
        (
            long.cache_write_prompt_tokens,
            long.cache_write_1h_prompt_tokens,
            long.reasoning_tokens
        ),
        (200.0, 100.0, 400.0)
    );
    assert_eq!(
        long.declared[Dimension::Images],
        3.0,
        "the images generated"
    );
    assert_eq!(long.encode().len(), 84, "13 fields and the images");
    assert_eq!(Row::decode(&long.encode()), Some(long));
    let before_images = Row {
        declared: DimMap::default(),
        ..long
    };
    assert_eq!(
        Row::decode(&long.encode()[..78]),
        Some(before_images),
        "a row stored before images existed reads as none"
    );
    let short = Row {
        cache_write_prompt_tokens: 0.0,
        cache_write_1h_prompt_tokens: 0.0,
        reasoning_tokens: 0.0,
        ..before_images
    };
    assert_eq!(Row::decode(&long.encode()[..60]), Some(short));
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
