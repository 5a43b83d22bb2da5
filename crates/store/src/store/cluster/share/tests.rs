//! The share's unit tests: leasing, taking, putting back, settling and the
//! slots, against a global key played by the tests.

use super::*;
use crate::domain::budget::Deltas;
use crate::domain::{Dimension, Level};
use crate::store::redis::EntryGrant;

fn global(requests: u64, concurrency: Option<u64>) -> LevelPlan {
    LevelPlan {
        level: Level::Global,
        group: None,
        slots: false,
        buckets: vec![BucketSpec {
            level: Level::Global,
            dimension: Dimension::Requests,
            limit: requests,
            period_secs: 3600,
            group: 0,
            window: None,
            alert_at: Default::default(),
        }],
        concurrency,
        overrun: None,
        idle_secs: None,
    }
}

const NEED: Need = Need {
    prompt: 10.0,
    max_output: 5.0,
    min_output: 5.0,
    rates: SpendRates {
        prompt: 0.0,
        output: 0.0,
    },
    headroom: 0.0,
    declared: crate::domain::DimMap([0; crate::domain::dimension::RATE_COUNT]),
};

/// Answers `ask` as a global key holding `level` requests would, leasing
/// what it has; returns what is left.
fn answer(share: &mut Share, lp: &LevelPlan, level: &mut f64, slots: &mut f64, now: f64) {
    let Some(ask) = share.ask(lp, now, false) else {
        return;
    };
    let b = &ask.buckets[0];
    *level = (*level + b.give).min(lp.buckets[0].limit as f64);
    let got = b.want.min(*level).max(0.0);
    *level -= got;
    let mine = share.slots.leased - ask.give_slots + ask.want_slots.min(*slots);
    *slots -= ask.want_slots.min(*slots) - ask.give_slots;
    let grant = EntryGrant {
        state: None,
        granted: vec![got],
        slots_mine: mine,
        slots_in_use: mine,
    };
    share.apply(&ask, &grant, now);
}

#[test]
fn a_share_leases_chunks_and_never_spends_more_than_it_leased() {
    let lp = global(100, None);
    let mut share = Share::default();
    let mut level = 100.0;
    let mut granted = 0;
    for i in 0..200 {
        let now = i as f64;
        let lease = format!("#{i}");
        let try_take = |share: &mut Share| take(&[&lp], &mut [share], &NEED, &lease, 1e9, now).0;
        let mut result = try_take(&mut share);
        if result.is_err() {
            answer(&mut share, &lp, &mut level, &mut 0.0, now);
            result = try_take(&mut share);
        }
        if result.is_ok() {
            granted += 1;
        }
    }
    assert_eq!(granted, 100, "every unit of the limit, and no more");
    assert_eq!(level, 0.0);
}

#[test]
fn a_denied_reservation_puts_back_what_it_took_and_unused_budget_goes_home() {
    let lp = global(1000, Some(4));
    let mut share = Share::default();
    let (mut level, mut slots) = (1000.0, 4.0);
    assert!(
        take(&[&lp], &mut [&mut share], &NEED, "#a", 1e9, 0.0)
            .0
            .is_err()
    );
    answer(&mut share, &lp, &mut level, &mut slots, 0.0);
    assert_eq!(
        level,
        1000.0 - 32.0,
        "a chunk is 32 reservations, under 5% of the limit"
    );
    assert_eq!(slots, 3.0, "5% of 4 slots is at least one");
    let taken = take(&[&lp], &mut [&mut share], &NEED, "#a", 1e9, 1.0)
        .0
        .unwrap();
    put_back(&[&lp], &mut [&mut share], &taken, &NEED, None, 1.0);
    assert_eq!(share.held_of(&lp.buckets[0]), 32.0);
    assert_eq!(share.slots.free, 1.0);
    // Idle past the hold: everything goes back.
    answer(&mut share, &lp, &mut level, &mut slots, 1.0 + HOLD_US);
    assert_eq!((level, slots), (1000.0, 4.0));
}

#[test]
fn a_slot_is_freed_once_whichever_way_it_comes_back() {
    let lp = global(1000, Some(10));
    let mut share = Share::default();
    let (mut level, mut slots) = (1000.0, 10.0);
    let _ = take(&[&lp], &mut [&mut share], &NEED, "#a", 5e6, 0.0);
    answer(&mut share, &lp, &mut level, &mut slots, 0.0);
    take(&[&lp], &mut [&mut share], &NEED, "#a", 5e6, 0.0)
        .0
        .unwrap();
    let free = share.slots.free;
    assert!(release(&mut share, "#a"));
    assert!(!release(&mut share, "#a"), "a second release frees nothing");
    assert!(!renew(&mut share, "#a", 0.0));
    assert_eq!(share.slots.free, free + 1.0);
    take(&[&lp], &mut [&mut share], &NEED, "#b", 5e6, 0.0)
        .0
        .unwrap();
    assert_eq!(share.reclaim(5e6 + SLOT_GRACE_US), 1, "lapsed after grace");
    assert!(!release(&mut share, "#b"));
}

#[test]
fn an_overage_is_owed_and_a_refund_goes_home_unspent() {
    let lp = global(1000, None);
    let mut share = Share::default();
    let deltas = Deltas::with([(Dimension::Requests, -1.0)]);
    settle(&[&lp], &mut [&mut share], deltas, 0.0);
    assert_eq!(
        share.held_of(&lp.buckets[0]),
        0.0,
        "a refund is not spent here"
    );
    let ask = share.ask(&lp, 0.0, false).unwrap();
    assert_eq!(
        ask.buckets[0].give, 1.0,
        "it goes to the global key, capped there"
    );
    let owed = Deltas::with([(Dimension::Requests, 3.0)]);
    settle(&[&lp], &mut [&mut share], owed, 0.0);
    let ask = share.ask(&lp, 0.0, false).unwrap();
    assert_eq!(ask.buckets[0].give, -3.0, "the debt goes to the global key");
}

#[test]
fn held_slots_renew_their_count_every_second_while_steady() {
    let lp = global(1000, Some(100));
    let mut share = Share::default();
    let (mut level, mut slots) = (1000.0, 100.0);
    let _ = take(&[&lp], &mut [&mut share], &NEED, "#a", 60e6, 0.0);
    answer(&mut share, &lp, &mut level, &mut slots, 0.0);
    take(&[&lp], &mut [&mut share], &NEED, "#a", 60e6, 0.0)
        .0
        .unwrap();
    // Steady: slots in use, some free, buckets topped up: nothing to change.
    share.ask(&lp, 1.0, false);
    assert!(
        share
            .ask(&lp, 2.0, false)
            .is_none_or(|a| a.want_slots == 0.0)
    );
    let ask = share.ask(&lp, 1.1e6, false).expect("the count is renewed");
    assert!(
        ask.slots_until >= 60e6 + SLOT_GRACE_US,
        "past the longest lease"
    );
}
