//! The lines of waiting calls, differentially: random joins, standings,
//! leaves (granted and withdrawn), wake-ups, clock moves and owners that
//! stop calling, run on the memory store's lines (`FairQueue`) and on
//! `lua/line.lua` over a real Redis with one clock; every answer must be the
//! same — the same tickets (arrival, owner, deadline, cost, weight, tenant),
//! the same first ticket, the same counts — and a line emptied and past its
//! keeping must leave no key in Redis.

use super::keys::CLOCK_KEY;
use crate::support::RedisServer;
use ctxbudget::domain::{Clock, ManualClock};
use ctxbudget::store::Retention;
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget::store::line::{Joined, Joining, Leave, LineStore, LineView, Ticket};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::redis::{RedisSettings, RedisStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

fn same_view(m: &LineView, r: &LineView, what: &str) {
    assert_eq!(m.waiting, r.waiting, "{what}: waiting");
    assert_eq!(m.first, r.first, "{what}: first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_script_keeps_the_memory_stores_fair_order() {
    let server = RedisServer::start();
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    let clock = ManualClock::new(1_800_000_000_000_000);
    let retention = Retention {
        record_ms: 1_000,
        idempotency_ms: 1_000,
        samples: 100,
        ledger: None,
        alert_queue: 0,
    };
    let memory = MemoryStore::with_clock(keys.clone(), retention, clock.clone());
    let settings = RedisSettings {
        url: server.url(),
        pool: Default::default(),
        connections: 1,
        timeout: Duration::from_secs(30),
        tls: Default::default(),
        cluster_nodes: Vec::new(),
    };
    let redis = RedisStore::connect(&settings, keys.clone(), retention)
        .await
        .unwrap()
        .with_clock_key(CLOCK_KEY);
    let mut conn = server.conn();
    let owners = ["aaaa", "bbbb", "cccc"];
    let tenants = ["acme", "globex", "in|itech"];
    for seed in 0..12u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        // Both held tickets, as each store named them.
        let mut held: Vec<(Ticket, Ticket)> = Vec::new();
        for step in 0..150 {
            let now = clock.now_us();
            let _: () = redis::cmd("SET")
                .arg(CLOCK_KEY)
                .arg(now)
                .query(&mut conn)
                .unwrap();
            let what = format!("seed {seed} step {step}");
            let owner = owners[rng.random_range(0..owners.len())];
            let line = ["", "gpt-4o"][rng.random_range(0..2)];
            match rng.random_range(0..10) {
                0..=3 => {
                    let j = Joining {
                        line,
                        owner,
                        class: rng.random_range(0..3),
                        tenant: tenants[rng.random_range(0..tenants.len())],
                        weight: rng.random_range(1..4u32),
                        cost: rng.random_range(1..3000u64),
                        wait_us: rng.random_range(1..8) * 1_000_000,
                        most: 12,
                    };
                    let (m, r) = (
                        memory.join(&j).await.unwrap(),
                        redis.join(&j).await.unwrap(),
                    );
                    match (m, r) {
                        (
                            Joined::Waiting {
                                ticket: mt,
                                first: mf,
                            },
                            Joined::Waiting {
                                ticket: rt,
                                first: rf,
                            },
                        ) => {
                            assert_eq!(mt.id, rt.id, "{what}: joined");
                            assert_eq!(mf, rf, "{what}: first on joining");
                            held.push((mt, rt));
                        }
                        (m, r) => assert_eq!(m, r, "{what}: join"),
                    }
                }
                4 | 5 if !held.is_empty() => {
                    let (mt, rt) = &held[rng.random_range(0..held.len())];
                    let (m, r) = (
                        memory.standing(mt, owner).await.unwrap(),
                        redis.standing(rt, owner).await.unwrap(),
                    );
                    assert_eq!(m, r, "{what}: standing");
                }
                6 | 7 if !held.is_empty() => {
                    let (mt, rt) = held.swap_remove(rng.random_range(0..held.len()));
                    let how = [Leave::Granted, Leave::Withdrawn][rng.random_range(0..2)];
                    let (m, r) = (
                        memory.leave(&mt, owner, how).await.unwrap(),
                        redis.leave(&rt, owner, how).await.unwrap(),
                    );
                    same_view(&m, &r, &format!("{what}: leave {how:?}"));
                }
                8 => {
                    let (m, r) = (
                        memory.wake(line, owner).await.unwrap(),
                        redis.wake(line, owner).await.unwrap(),
                    );
                    same_view(&m, &r, &format!("{what}: wake"));
                }
                // Time passes: deadlines, and owners that stopped calling.
                _ => clock.advance_us(rng.random_range(0..3_000_000)),
            }
        }
        // Every line drained keeps its clocks until a second after its
        // latest deadline, then leaves no key in Redis.
        for (mt, rt) in held.drain(..) {
            memory.leave(&mt, "aaaa", Leave::Withdrawn).await.unwrap();
            redis.leave(&rt, "aaaa", Leave::Withdrawn).await.unwrap();
        }
        clock.advance_us(9_000_000);
        let now = clock.now_us();
        let _: () = redis::cmd("SET")
            .arg(CLOCK_KEY)
            .arg(now)
            .query(&mut conn)
            .unwrap();
        for line in ["", "gpt-4o"] {
            let (m, r) = (
                memory.wake(line, "aaaa").await.unwrap(),
                redis.wake(line, "aaaa").await.unwrap(),
            );
            same_view(&m, &r, &format!("seed {seed}: drained"));
        }
        let left: Vec<String> = redis::cmd("KEYS")
            .arg("ctxb:{q:*")
            .query(&mut conn)
            .unwrap();
        assert!(left.is_empty(), "seed {seed}: keys left {left:?}");
    }
}
