//! The differential test: random operation sequences run on a
//! [`MemoryStore`] with a [`ManualClock`] and on a [`RedisStore`] over a real
//! redis-server, side by side. Every reply, status read and estimator read
//! must be identical, and after every operation the two must hold the same
//! keys with byte-equal values: the Lua scripts are the Redis port of
//! `crates/core/src/budget/`, and this holds them to it.
//!
//! A third column holds the Redis Cluster store's global share (its own
//! take, put-back, settle and give-back arithmetic) to the memory store's
//! global level on the same operations: see [`share`] for how, and for what
//! a leased share may legitimately do otherwise.
//!
//! # One clock for both
//! The scripts read "now" from [`keys::CLOCK_KEY`]
//! ([`RedisStore::with_clock_key`]), written with the memory store's instant
//! before each call, so both compute with the same µs.
//!
//! # Key expiry, exactly
//! Redis expires keys by its real clock, the memory store by the test clock.
//! So Redis is never left to expire anything: after every operation one
//! script dumps every key with its `PEXPIRETIME` and `PERSIST`s it. A key the
//! operation gave a TTL must expire when memory's copy does: the scripts set
//! `ceil((expiry - now) / 1000)` ms from Redis's real time of the call, and
//! the test brackets that time by Redis `TIME` read just before the call and
//! in the dump, so the check is exact to Redis's 1 ms resolution however slow
//! the machine (a stalled call only widens the bracket). A key given no TTL
//! must keep the expiry memory had when Redis last set one. When the clock
//! moves, the test `DEL`s in Redis exactly the keys whose expiry has passed
//! (`expiry <= now`, the memory store's rule), and the next comparison checks
//! memory dropped the same. (Real Redis, rounding up to whole ms, would hold
//! a key up to 1 ms past its state's expiry; the test follows memory there.)
//! The shortest TTL the scripts set is a second (`TTL_SLACK_US`, record
//! retention), far longer than an operation and its dump take.
//! A session's keys are compared the same way: they live at most their
//! `session_ttl` past a write (`LevelPlan::idle_secs`) yet outlive their
//! leases, and the generator draws some of a few seconds, so they lapse
//! within a case.
//!
//! # Replaying a failure
//! A mismatch panics with the case's seed, the operation index and the
//! operations so far; `CTXBUDGET_DIFF_SEED=<seed> CTXBUDGET_DIFF_CASES=1`
//! replays that case alone. A run longer than the default does not stop at
//! the first divergence: it reports each, then every failing seed. `CTXBUDGET_DIFF_CASES` (default
//! [`DEFAULT_CASES`]) sets how many cases run: `CTXBUDGET_DIFF_CASES=20000`
//! for a long run.

mod keys;
mod line;
mod ops;
mod reserve;
mod share;

use crate::support::RedisServer;
use ctxbudget::domain::budget::Settle;
use ctxbudget::domain::budget::ledger::LedgerRetention;
use ctxbudget::domain::mix::EstimatorSample;
use ctxbudget::domain::{Clock, LevelPlan, ManualClock, Reading, ReservationId};
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget::store::memory::{MemoryStore, Stored};
use ctxbudget::store::redis::{RedisSettings, RedisStore};
use ctxbudget::store::{
    AlertStore, ChargeReply, EXACT_LEASES, LedgerStore, QueuedAlert, RenewReply, Retention,
    SampleStore, Scope, SettleReply, Settlement, Store,
};
use ops::{Gen, Op, entry_plan, pick};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use share::Episode;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// Cases in a default (CI) run.
const DEFAULT_CASES: u64 = 200;
/// The first case's seed; case i uses `seed + i`.
const DEFAULT_SEED: u64 = 0x0c7b_0011;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
        })
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_redis_and_the_cluster_share_agree_on_random_sequences() {
    let cases = env_u64("CTXBUDGET_DIFF_CASES", DEFAULT_CASES);
    let seed = env_u64("CTXBUDGET_DIFF_SEED", DEFAULT_SEED);
    let server = RedisServer::start();
    let mut db = keys::Db::connect(&server.url(), DEFAULT_PREFIX).await;
    let (mut ops, started) = (0, std::time::Instant::now());
    let mut seen = Seen::new();
    let mut failed = Vec::new();
    for case in 0..cases {
        let case_seed = seed.wrapping_add(case);
        let Err(e) = run_case(case_seed, &server, &mut db, &mut seen)
            .await
            .map(|n| ops += n)
        else {
            continue;
        };
        let report = format!(
            "the stores diverged in case {case}, seed {case_seed}: {e}\nreplay: \
             CTXBUDGET_DIFF_SEED={case_seed} CTXBUDGET_DIFF_CASES=1 cargo nextest run \
             --test store -E 'test(/^differential::/)'"
        );
        if cases <= DEFAULT_CASES {
            panic!("{report}");
        }
        // A long run goes on, to find every divergence, not just the first.
        eprintln!("{report}\n");
        failed.push(format!(
            "seed {case_seed}: {}",
            e.lines().take(4).collect::<Vec<_>>().join(" | ")
        ));
    }
    eprintln!(
        "differential: {cases} cases, {ops} operations, seeds {seed}.., {:?}\n  outcomes: {seen:?}",
        started.elapsed()
    );
    assert!(
        failed.is_empty(),
        "{} of {cases} cases diverged:\n{}",
        failed.len(),
        failed.join("\n")
    );
    if cases >= DEFAULT_CASES {
        for outcome in MUST_SEE {
            assert!(
                seen.contains_key(outcome),
                "no {outcome} in {cases} cases: the generator no longer reaches it ({seen:?})"
            );
        }
    }
}

/// How often each kind of answer came: proof the sequences reach every path.
type Seen = BTreeMap<&'static str, u64>;

/// The answers a default run must reach.
const MUST_SEE: [&str; 44] = [
    "reserve_first allowed the first candidate",
    "reserve_first allowed the second candidate",
    "reserve_first denied every candidate",
    "reserve allowed in a session",
    "reserve allowed in a session of no user",
    "reserve reclaimed leases at the session level",
    "a session's lease outliving its session_ttl",
    "a session key lapsed",
    "charge in a session",
    "settle or renew with another session found nothing",
    "reserve holding the learned output at every level",
    "reserve with a learned output, the grant held at some level",
    "status exact at the most leases read whole",
    "a level keeping the most foreign buckets",
    "status exact",
    "estimator samples read",
    "reserve allowed",
    "reserve denied",
    "reserve replayed",
    "reserve idempotency conflict",
    "reserve idempotency spent",
    "reserve reclaimed leases",
    "commit applied",
    "commit already settled",
    "commit not found",
    "refund applied",
    "refund already settled",
    "renew renewed",
    "renew already settled",
    "renew expired",
    "renew not found",
    "charge denied",
    "charge checked",
    "charge taken",
    "charge forced",
    "share took the global grant",
    "share took more, another level granting less",
    "share short where memory denied",
    "share put back, another level denying",
    "share charged",
    "share short of a charge",
    "share uncharged, another level denying",
    "share settled",
    "share gave back or owed",
];

fn count(seen: &mut Seen, what: &'static str) {
    *seen.entry(what).or_default() += 1;
}

/// A settlement or renewal by `id` whose session is not the one it was
/// issued with must find nothing: the session is part of who may settle.
fn other_session(
    g: &Gen,
    id: &ReservationId,
    not_found: bool,
    seen: &mut Seen,
) -> Result<(), String> {
    if !g.other_session(id) {
        return Ok(());
    }
    count(seen, "settle or renew with another session found nothing");
    match not_found {
        true => Ok(()),
        false => Err(format!(
            "{:?} settled or renewed a reservation issued in another session",
            id.session
        )),
    }
}

fn settled(what: &str, reply: &SettleReply) -> &'static str {
    match (what, reply) {
        ("commit", SettleReply::Applied { .. }) => "commit applied",
        ("commit", SettleReply::AlreadySettled(_)) => "commit already settled",
        ("commit", SettleReply::NotFound) => "commit not found",
        (_, SettleReply::Applied { .. }) => "refund applied",
        (_, SettleReply::AlreadySettled(_)) => "refund already settled",
        (_, SettleReply::NotFound) => "refund not found",
    }
}

/// One case: a fresh database, random retention and limits, a random number
/// of operations. Answers how many ran.
async fn run_case(
    seed: u64,
    server: &RedisServer,
    db: &mut keys::Db,
    seen: &mut Seen,
) -> Result<usize, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let retention = Retention {
        record_ms: *[1_000, 5_000, 60_000].get(rng.random_range(0..3)).unwrap(),
        idempotency_ms: *[1_000, 3_000, 120_000].get(rng.random_range(0..3)).unwrap(),
        samples: rng.random_range(1..=5),
        // The ledger mostly on, its rows sometimes kept only seconds past their
        // hour or day (so they expire within a case).
        ledger: rng.random_bool(0.85).then(|| LedgerRetention {
            hourly_us: *pick(&mut rng, &[2_000_000, 3_600_000_000, 3_024_000_000_000]),
            daily_us: *pick(&mut rng, &[5_000_000, 86_400_000_000, 34_560_000_000_000]),
        }),
        // Alerts mostly on, the queue sometimes small enough to fill.
        alert_queue: *pick(&mut rng, &[0, 3, 1_000, 1_000]),
    };
    // Mostly short runs; some long ones; some where the limits keep changing
    // (so a level gathers more foreign buckets than it keeps).
    // (so a level gathers more foreign buckets than it keeps); some crowded
    // with leases, around the most an exact status reads whole.
    let kind = rng.random_range(0..20);
    let (length, churn) = match kind {
        0..=1 => (rng.random_range(100..=200), 0.0),
        2 => (rng.random_range(200..=300), 0.3),
        3 => (rng.random_range(60..=120), 0.0),
        _ => (rng.random_range(5..=40), 0.0),
    };
    let mut config: [LevelPlan; ops::ENTRIES] = std::array::from_fn(|i| entry_plan(&mut rng, i));
    if kind == 3 {
        let around = EXACT_LEASES..=EXACT_LEASES + 1;
        for l in &mut config {
            l.concurrency = Some(rng.random_range(around.clone()));
            l.buckets
                .iter_mut()
                .for_each(|b| b.limit = b.limit.max(5_000_000));
        }
    }
    let mut g = Gen {
        rng,
        config,
        issued: Vec::new(),
        claimed: Vec::new(),
        taken: Vec::new(),
        churn,
        crowd: kind == 3,
        now: 0,
    };
    db.reset().await;
    let clock = ManualClock::new(1_800_000_000_000_000);
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    let memory = MemoryStore::with_clock(keys.clone(), retention, clock.clone());
    let redis = RedisStore::connect(
        &RedisSettings {
            url: server.url(),
            pool: Default::default(),
            connections: 1,
            timeout: Duration::from_secs(30),
            tls: Default::default(),
            cluster_nodes: Vec::new(),
        },
        keys,
        retention,
    )
    .await
    .map_err(|e| format!("connect: {e}"))?
    .with_clock_key(keys::CLOCK_KEY);
    let mut log = String::new();
    for i in 0..length {
        let now = clock.now_us();
        let snapshot = memory.snapshot();
        if snapshot.values().any(|(v, _)| crowded(v)) {
            count(seen, "a level keeping the most foreign buckets");
        }
        let mut expiries = db.expiries(&snapshot);
        // Calendar window boundaries are instants worth landing on too.
        let windows = g
            .config
            .iter()
            .flat_map(|l| &l.buckets)
            .filter_map(|b| b.window);
        expiries.extend(windows.map(|w| w.window.span(now).end_us));
        let op = g.next(now, &expiries);
        let _ = writeln!(log, "    #{i} at {now}: {}", brief(&op));
        let t0 = db.set_clock(now).await;
        step(&mut g, &op, &memory, &redis, &clock, db, seen)
            .await
            .map_err(|e| {
                format!("operation #{i} ({retention:?}):\n  {e}\noperations so far:\n{log}")
            })?;
        let now = clock.now_us();
        if matches!(op, Op::Advance(_) | Op::Reconfigure(..)) && db.expire(now).await {
            count(seen, "a session key lapsed");
        }
        db.compare(&memory.snapshot(), now, t0).await.map_err(|e| {
            format!("operation #{i}: keys differ:\n  {e}\noperations so far:\n{log}")
        })?;
    }
    Ok(length)
}

/// A level state holding more buckets than any configuration has: foreign
/// buckets up to the cap (4 doubles of header, 4 per bucket).
fn crowded(v: &Stored) -> bool {
    matches!(v, Stored::Hash(f) if f.get("s").is_some_and(|s| s.len() / 8 >= 4 + 4 * 17))
}

/// Runs `op` on both stores and compares what they answer.
async fn step(
    g: &mut Gen,
    op: &Op,
    memory: &MemoryStore<ManualClock>,
    redis: &RedisStore,
    clock: &ManualClock,
    db: &mut keys::Db,
    seen: &mut Seen,
) -> Result<(), String> {
    match op {
        Op::Reserve(plans) => reserve::one_by_one(g, plans, memory, redis, clock, seen).await?,
        Op::ReserveFirst(plans) => reserve::first(g, plans, memory, redis, clock, seen).await?,
        Op::Commit { id, levels, usage } => {
            let (s, usage) = (Settlement { id, levels }, *usage);
            let global = Episode::before(memory, levels, &id.tenant, clock.now_us());
            let m = memory.commit(s, usage).await.unwrap();
            count(seen, settled("commit", &m));
            other_session(g, id, m == SettleReply::NotFound, seen)?;
            same("commit", m, redis.commit(s, usage).await.unwrap())?;
            if let Some(mut ep) = global {
                ep.settle(Settle::Commit(usage), &m, seen);
                let e = ep.compare(memory, false, seen).await;
                e.map_err(|e| on_share("commit", e))?;
            }
        }
        Op::Refund { id, levels } => {
            let s = Settlement { id, levels };
            let global = Episode::before(memory, levels, &id.tenant, clock.now_us());
            let m = memory.refund(s).await.unwrap();
            count(seen, settled("refund", &m));
            other_session(g, id, m == SettleReply::NotFound, seen)?;
            same("refund", m, redis.refund(s).await.unwrap())?;
            if let Some(mut ep) = global {
                ep.settle(Settle::Refund, &m, seen);
                let e = ep.compare(memory, false, seen).await;
                e.map_err(|e| on_share("refund", e))?;
            }
        }
        Op::Renew { id, levels, ttl_ms } => {
            let s = Settlement { id, levels };
            let m = memory.renew(s, *ttl_ms).await.unwrap();
            other_session(g, id, m == RenewReply::NotFound, seen)?;
            if let RenewReply::Renewed { .. } = m {
                let expiry = clock.now_us() + *ttl_ms as i64 * 1000;
                g.taken
                    .iter_mut()
                    .filter(|(t, _)| t == id)
                    .for_each(|t| t.1 = expiry);
            }
            count(
                seen,
                match m {
                    RenewReply::Renewed { .. } => "renew renewed",
                    RenewReply::AlreadySettled => "renew already settled",
                    RenewReply::Expired => "renew expired",
                    RenewReply::NotFound => "renew not found",
                },
            );
            same("renew", m, redis.renew(s, *ttl_ms).await.unwrap())?;
        }
        Op::Status {
            tenant,
            user,
            session,
            levels,
            exact,
        } => {
            let scope = Scope {
                tenant,
                user: user.as_ref(),
                session: session.as_ref(),
            };
            let m = memory.status(scope, levels, *exact).await.unwrap();
            count(seen, if *exact { "status exact" } else { "status" });
            let at_limit = |r: &Reading| matches!(r, Reading::Concurrency { active, .. } if *active == EXACT_LEASES);
            if *exact && m.iter().any(at_limit) {
                count(seen, "status exact at the most leases read whole");
            }
            same(
                "status",
                m,
                redis.status(scope, levels, *exact).await.unwrap(),
            )?;
        }
        Op::Charge(plan) => {
            let global = Episode::before(memory, &plan.levels, &plan.tenant, clock.now_us());
            let m = memory.charge(plan).await.unwrap();
            if plan.session.is_some() && !plan.takes_nothing() {
                count(seen, "charge in a session");
            }
            count(
                seen,
                match (&m, plan.enforce, plan.takes_nothing()) {
                    (ChargeReply::Denied { .. }, _, _) => "charge denied",
                    (_, true, true) => "charge checked",
                    (_, true, false) => "charge taken",
                    (_, false, _) => "charge forced",
                },
            );
            same("charge", m.clone(), redis.charge(plan).await.unwrap())?;
            if let Some(mut ep) = global {
                ep.charge(plan, &m, seen)
                    .map_err(|e| on_share("charge", e))?;
                let e = ep.compare(memory, false, seen).await;
                e.map_err(|e| on_share("charge", e))?;
            }
        }
        Op::Samples(keys) => {
            let bits = |v: Vec<Vec<EstimatorSample>>| -> Vec<Vec<Vec<u8>>> {
                v.iter()
                    .map(|s| s.iter().map(EstimatorSample::encode).collect())
                    .collect()
            };
            let m = memory.estimator_samples(keys).await.unwrap();
            if m.iter().any(|s| !s.is_empty()) {
                count(seen, "estimator samples read");
            }
            let r = redis.estimator_samples(keys).await.unwrap();
            same("estimator samples (bytes)", bits(m), bits(r))?;
        }
        Op::Ledger(tenant, periods) => {
            let m = memory.ledger(tenant, periods).await.unwrap();
            if m.iter().any(|rows| !rows.is_empty()) {
                count(seen, "ledger rows read");
            }
            let r = redis.ledger(tenant, periods).await.unwrap();
            same("ledger rows", m, r)?;
        }
        Op::ClaimAlerts { max, claim_ms } => {
            let sorted = |mut v: Vec<QueuedAlert>| {
                v.sort_by(|a, b| (&a.queue, &a.id).cmp(&(&b.queue, &b.id)));
                v
            };
            let m = sorted(memory.claim_alerts(*max, *claim_ms).await.unwrap());
            if !m.is_empty() {
                count(seen, "alerts claimed");
            }
            let r = sorted(redis.claim_alerts(*max, *claim_ms).await.unwrap());
            same("alerts claimed", &m, &r)?;
            if !m.is_empty() {
                g.claimed = m;
            }
        }
        Op::FinishAlert { which, done } => {
            if let Some(a) = g.claimed.get(*which % g.claimed.len().max(1)).cloned() {
                count(seen, "alerts finished");
                memory.finish_alert(&a, *done).await.unwrap();
                redis.finish_alert(&a, *done).await.unwrap();
            }
        }
        Op::Advance(us) => {
            clock.advance_us(*us);
            db.set_clock(clock.now_us()).await;
        }
        Op::Reconfigure(i, plan) => {
            let i = *i;
            // A new configuration applies at once, possibly in the instant
            // another configuration's reserve touched the same level.
            g.config[i] = plan.clone();
        }
    }
    Ok(())
}

/// `m` and `r` are the memory and Redis stores' answers to `what`: equal.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, m: T, r: T) -> Result<(), String> {
    if m == r {
        Ok(())
    } else {
        Err(format!("{what}:\n    memory {m:?}\n    redis  {r:?}"))
    }
}

/// A divergence of the cluster share's column, said as such.
fn on_share(what: &str, e: String) -> String {
    format!("{what}, the cluster share against memory's global level:\n    {e}")
}

/// One line per operation for the failure log.
fn brief(op: &Op) -> String {
    let id = |id: &ctxbudget::domain::ReservationId| {
        format!(
            "{}/{}/{:?}/{}/{} {}",
            id.tenant.as_str(),
            id.user.as_ref().map_or("-", |u| u.as_str()),
            id.session.as_ref().map(|s| s.as_str()),
            id.tier,
            id.estimator,
            &id.nonce_b64()[..6]
        )
    };
    match op {
        Op::Reserve(plans) | Op::ReserveFirst(plans) => plans
            .iter()
            .map(|p| {
                let what = match op {
                    Op::ReserveFirst(_) => "reserve_first candidate",
                    _ => "reserve",
                };
                format!(
                    "{what} {} prompt {} out {}..{} est {} lease {} ms key {:?} fp {} levels {:?}",
                    id(&p.id),
                    p.prompt_tokens,
                    p.min_output_tokens,
                    p.max_output_tokens,
                    p.estimated_prompt_tokens,
                    p.lease_ttl_ms,
                    p.idempotency_key.as_ref().map(|k| k.as_str()),
                    p.fingerprint,
                    p.levels
                )
            })
            .collect::<Vec<_>>()
            .join("\n        "),
        Op::Commit {
            id: i, usage: u, ..
        } => format!(
            "commit {} {} ({} prompt, {} input, {}/{}/{} cached/written/written 1h, {} reasoning)",
            id(i),
            u.tokens,
            u.prompt,
            u.input,
            u.cached,
            u.cache_write,
            u.cache_write_1h,
            u.reasoning
        ),
        Op::Refund { id: i, .. } => format!("refund {}", id(i)),
        Op::Renew { id: i, ttl_ms, .. } => format!("renew {} {ttl_ms} ms", id(i)),
        Op::Status {
            tenant,
            user,
            session,
            exact,
            levels,
        } => format!(
            "status {}/{}/{:?} exact {exact} ({} levels)",
            tenant.as_str(),
            user.as_ref().map_or("-", |u| u.as_str()),
            session.as_ref().map(|s| s.as_str()),
            levels.len()
        ),
        Op::Charge(p) => format!(
            "charge {} requests {} tokens (enforced: {}) at {}/{}/{:?} levels {:?}",
            p.requests,
            p.tokens,
            p.enforce,
            p.tenant.as_str(),
            p.user.as_ref().map_or("-", |u| u.as_str()),
            p.session.as_ref().map(|s| s.as_str()),
            p.levels
        ),
        Op::Samples(_) => "estimator samples".into(),
        Op::ClaimAlerts { max, claim_ms } => format!("claim {max} alerts for {claim_ms} ms"),
        Op::FinishAlert { which, done } => format!("finish claimed alert {which}: {done:?}"),
        Op::Ledger(tenant, _) => format!("ledger of {}", tenant.as_str()),
        Op::Advance(us) => format!("advance {us} µs"),
        Op::Reconfigure(i, plan) => format!("reconfigure entry {i}: {plan:?}"),
    }
}
