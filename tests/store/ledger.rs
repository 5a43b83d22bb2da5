//! The usage ledger through the [`Store`] trait, on both stores (generated as
//! `ledger::memory::<test>` and `ledger::redis::<test>`, like the suite): each
//! reservation enters its tenant's hourly and daily rows once when taken and
//! moves once when settled, and a week of traffic on the test clock sums to
//! exactly what was committed. Retention (the rows' expiry) is the memory
//! store's alone here: Redis expires by its own clock, which the test clock
//! does not move (the differential test holds the two stores' expiries equal).

use crate::suite::{Ctx, plan, user_level};
use ctxbudget::domain::budget::ledger::{LedgerRetention, LedgerRow, Period, Row};
use ctxbudget::domain::{Clock, ManualClock, ReservePlan, TenantId, UserId};
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::{LedgerStore, Retention, SettleReply, Settlement, Store, Usage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

suite!(
    each_reservation_enters_once_and_moves_once_to_its_outcome,
    a_week_of_traffic_sums_to_exactly_what_was_committed,
);

const HOUR_US: i64 = 3_600_000_000;
const DAY_US: i64 = 86_400_000_000;

/// A reservation by `user` of `tenant` for model group `group`, its lease
/// 6 hours (so it can be settled hours later).
fn reservation(
    tenant: &str,
    user: Option<&str>,
    group: &str,
    prompt: u64,
    out: u64,
) -> ReservePlan {
    let mut p = plan("x", vec![user_level(1_000_000, 1 << 40, None)], prompt, out);
    p.id.tenant = TenantId::parse(tenant).unwrap();
    p.id.user = user.map(|u| UserId::parse(u).unwrap());
    p.id.group = group.into();
    p.lease_ttl_ms = 6 * 3_600_000;
    p
}

/// A row's name in these tests: its group on an hourly row, `group:user` on
/// a daily one.
fn name(period: Period, r: &LedgerRow) -> String {
    match period {
        Period::Hour(_) => r.group.clone(),
        Period::Day(_) => format!("{}:{}", r.group, r.user.as_ref().map_or("", |u| u.as_str())),
    }
}

/// `tenant`'s rows of one period, by name.
async fn rows<S: Store>(c: &Ctx<S>, tenant: &str, period: Period) -> BTreeMap<String, Row> {
    let tenant = TenantId::parse(tenant).unwrap();
    let mut got = c.store.ledger(&tenant, &[period]).await.unwrap();
    got.pop()
        .unwrap()
        .into_iter()
        .map(|r| (name(period, &r), r.row))
        .collect()
}

fn periods(at_us: i64) -> (Period, Period) {
    Period::of(at_us as f64)
}

async fn each_reservation_enters_once_and_moves_once_to_its_outcome<S: Store>(c: &Ctx<S>) {
    let taken = c.clock.now_us();
    let (hour, day) = periods(taken);
    let a = reservation("acme", Some("alice"), "gpt-4o", 1_000, 500);
    let b = reservation("acme", Some("bob"), "", 2_000, 100);
    let late = reservation("acme", None, "", 700, 300);
    for p in [&a, &b, &late] {
        assert!(matches!(
            c.reserve(p).await,
            ctxbudget::store::ReserveReply::Allowed { .. }
        ));
    }
    let hourly = rows(c, "acme", hour).await;
    assert_eq!(
        hourly["gpt-4o"],
        Row {
            unsettled: 1.0,
            reserved_tokens: 1_500.0,
            ..Row::default()
        },
        "taken: one unsettled reservation with its tokens"
    );
    assert_eq!(hourly[""].unsettled, 2.0);
    assert_eq!(hourly[""].reserved_tokens, 3_100.0);

    // alice's call used 1,100 prompt tokens (300 cached) and 200 completion.
    let usage = Usage {
        cached: 300,
        cost: 4_250,
        learn: true,
        ..Usage::new(1_300, 1_100)
    };
    assert!(matches!(
        c.commit_usage(&a, usage).await,
        SettleReply::Applied { .. }
    ));
    assert!(matches!(
        c.commit_usage(&a, usage).await,
        SettleReply::AlreadySettled(_)
    ));
    assert!(matches!(c.refund(&b).await, SettleReply::Applied { .. }));
    // Settled two hours on: it counts in the hour it was taken.
    c.advance_ms(2 * 3_600_000).await;
    let (later, _) = periods(c.clock.now_us());
    assert!(matches!(
        c.commit_usage(&late, Usage::new(900, 650)).await,
        SettleReply::Applied { .. }
    ));

    let hourly = rows(c, "acme", hour).await;
    assert_eq!(
        hourly["gpt-4o"],
        Row {
            requests: 1.0,
            reserved_tokens: 1_500.0,
            prompt_tokens: 1_100.0,
            cached_prompt_tokens: 300.0,
            completion_tokens: 200.0,
            cost_micros: 4_250.0,
            prompt_reserved: 1_000.0,
            prompt_error: 100.0,
            ..Row::default()
        },
        "committed once, however often the commit came"
    );
    assert_eq!(
        hourly[""],
        Row {
            requests: 1.0,
            refunds: 1.0,
            reserved_tokens: 3_100.0,
            prompt_tokens: 650.0,
            completion_tokens: 250.0,
            prompt_reserved: 700.0,
            prompt_error: 50.0,
            ..Row::default()
        }
    );
    assert!(
        rows(c, "acme", later).await.is_empty(),
        "nothing moved to the settle's hour"
    );

    // Daily rows: per user and group, the same arithmetic.
    let daily = rows(c, "acme", day).await;
    assert_eq!(daily["gpt-4o:alice"], hourly["gpt-4o"]);
    assert_eq!(daily[":bob"].refunds, 1.0);
    assert_eq!(daily[":"].requests, 1.0);
    assert_eq!(daily.len(), 3);
}

/// One reservation of the week, as the test made it.
struct Made {
    plan: ReservePlan,
    at: i64,
}

/// A week of traffic on the test clock: 2 tenants, users and no user, three
/// model groups, reservations every few minutes, each committed (random usage,
/// sometimes in a later hour than it was taken), refunded or left unsettled.
/// The test keeps its own sums per row, by hand, and the ledger must equal them
/// exactly; so must the totals of what was committed.
async fn a_week_of_traffic_sums_to_exactly_what_was_committed<S: Store>(c: &Ctx<S>) {
    let mut rng = StdRng::seed_from_u64(7);
    let start = c.clock.now_us();
    let mut want: BTreeMap<(String, Period, String), Row> = BTreeMap::new();
    let mut add = |tenant: &str, plan: &ReservePlan, at: i64, row: Row| {
        let (hour, day) = periods(at);
        let user = plan.id.user.as_ref().map_or("", |u| u.as_str());
        let (hf, df) = (plan.id.group.clone(), format!("{}:{user}", plan.id.group));
        for (p, f) in [(hour, hf), (day, df)] {
            want.entry((tenant.into(), p, f)).or_default().add(&row);
        }
    };
    let (mut pending, mut committed_cost, mut commits) = (Vec::<Made>::new(), 0u64, 0u64);
    while c.clock.now_us() < start + 7 * DAY_US {
        c.advance_ms(rng.random_range(1..=6) * 60_000).await;
        let now = c.clock.now_us();
        if pending.is_empty() || rng.random_bool(0.45) {
            let tenant = ["acme", "beta"][rng.random_range(0..2)];
            let user = [Some("u1"), Some("u2"), None][rng.random_range(0..3)];
            let group = ["", "gpt-4o", "mini"][rng.random_range(0..3)];
            let (prompt, out) = (rng.random_range(1..5_000), rng.random_range(1..2_000));
            let p = reservation(tenant, user, group, prompt, out);
            assert!(matches!(
                c.reserve(&p).await,
                ctxbudget::store::ReserveReply::Allowed { .. }
            ));
            let row = Row {
                unsettled: 1.0,
                reserved_tokens: (prompt + out) as f64,
                ..Row::default()
            };
            add(tenant, &p, now, row);
            pending.push(Made { plan: p, at: now });
            continue;
        }
        let m = pending.swap_remove(rng.random_range(0..pending.len()));
        if now - m.at > 5 * HOUR_US {
            // Waited too long: left unsettled (its lease lapses).
            continue;
        }
        let tenant = m.plan.id.tenant.as_str().to_owned();
        let reserved_prompt = m.plan.prompt_tokens as f64;
        let mut row = Row {
            unsettled: -1.0,
            ..Row::default()
        };
        match rng.random_range(0..10) {
            0..=6 => {
                let prompt = rng.random_range(0..6_000u64);
                let completion = rng.random_range(0..2_500u64);
                let cached = rng.random_range(0..=prompt);
                let cost = rng.random_range(0..50_000u64);
                let usage = Usage {
                    cached,
                    cost,
                    ..Usage::new(prompt + completion, prompt)
                };
                assert!(matches!(
                    c.commit_usage(&m.plan, usage).await,
                    SettleReply::Applied { .. }
                ));
                // A retried Commit adds nothing.
                if rng.random_bool(0.2) {
                    c.commit_usage(&m.plan, usage).await;
                }
                row.requests = 1.0;
                row.prompt_tokens = prompt as f64;
                row.cached_prompt_tokens = cached as f64;
                row.completion_tokens = completion as f64;
                row.cost_micros = cost as f64;
                row.prompt_reserved = reserved_prompt;
                row.prompt_error = (reserved_prompt - prompt as f64).abs();
                committed_cost += cost;
                commits += 1;
            }
            7..=8 => {
                assert!(matches!(
                    c.refund(&m.plan).await,
                    SettleReply::Applied { .. }
                ));
                row.refunds = 1.0;
            }
            // Never settled: it stays unsettled.
            _ => continue,
        }
        add(&tenant, &m.plan, m.at, row);
    }

    let mut got_cost = 0.0;
    let mut got_requests = 0.0;
    for tenant in ["acme", "beta"] {
        let t = TenantId::parse(tenant).unwrap();
        let (Period::Hour(first), _) = periods(start) else {
            unreachable!()
        };
        let hours: Vec<Period> = (first..=first + 7 * 24 + 1).map(Period::Hour).collect();
        let (_, Period::Day(first_day)) = periods(start) else {
            unreachable!()
        };
        let days: Vec<Period> = (first_day..=first_day + 8).map(Period::Day).collect();
        for (p, fields) in hours.iter().chain(&days).zip(
            c.store
                .ledger(&t, &[hours.clone(), days.clone()].concat())
                .await
                .unwrap(),
        ) {
            for r in fields {
                let key = (tenant.to_owned(), *p, name(*p, &r));
                let row = r.row;
                assert_eq!(Some(&row), want.get(&key), "{key:?}");
                if matches!(p, Period::Hour(_)) {
                    got_cost += row.cost_micros;
                    got_requests += row.requests;
                }
                want.remove(&key);
            }
        }
    }
    assert!(want.is_empty(), "rows the ledger lacks: {want:?}");
    assert!(commits > 300, "a week of traffic: {commits} commits");
    assert_eq!(
        got_cost, committed_cost as f64,
        "the ledger's cost is what was committed"
    );
    assert_eq!(got_requests, commits as f64);
}

/// A memory store keeping hourly rows 1 h and daily rows 1 day past their end.
fn short_lived() -> (MemoryStore<ManualClock>, ManualClock) {
    let clock = ManualClock::new(1_800_000_000_000_000);
    let retention = Retention {
        record_ms: 10 * 86_400_000,
        idempotency_ms: 1_000,
        samples: 3,
        ledger: Some(LedgerRetention {
            hourly_us: HOUR_US,
            daily_us: DAY_US,
        }),
        alert_queue: 0,
    };
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    (
        MemoryStore::with_clock(keys, retention, clock.clone()),
        clock,
    )
}

#[tokio::test]
async fn rows_expire_after_their_retention_and_a_late_settle_skips_expired_rows() {
    let (store, clock) = short_lived();
    let tenant = TenantId::parse("acme").unwrap();
    let (hour, day) = periods(clock.now_us());
    let p = reservation("acme", Some("u"), "g", 10, 10);
    store.reserve(&p).await.unwrap();
    let settlement = Settlement {
        id: &p.id,
        levels: &p.levels,
    };
    let read = |periods: [Period; 2]| {
        let store = &store;
        let tenant = tenant.clone();
        async move { store.ledger(&tenant, &periods).await.unwrap() }
    };
    assert!(read([hour, day]).await.iter().all(|rows| rows.len() == 1));
    // Past the hour's end and its hour of retention: the hourly row is gone.
    clock.advance_us(2 * HOUR_US + 1);
    let [hourly, daily] = <[_; 2]>::try_from(read([hour, day]).await).unwrap();
    assert!(hourly.is_empty(), "the hourly row expired");
    assert_eq!(daily.len(), 1, "the daily row is kept longer");
    // A commit now enters the daily row only: its hour is past retention.
    store.commit(settlement, Usage::new(15, 10)).await.unwrap();
    let [hourly, daily] = <[_; 2]>::try_from(read([hour, day]).await).unwrap();
    assert!(hourly.is_empty(), "an expired hour is not written again");
    assert_eq!(daily[0].row.requests, 1.0);
    assert_eq!(daily[0].row.unsettled, 0.0);
    clock.advance_us(2 * DAY_US);
    assert!(read([hour, day]).await.iter().all(Vec::is_empty));
}
