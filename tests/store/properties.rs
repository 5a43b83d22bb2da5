//! Properties of the budget arithmetic, over random operation sequences run
//! against the memory store (which repeats the Lua scripts' arithmetic
//! operation for operation) with a hand-moved clock:
//!
//! - conservation: with the clock still, every bucket reads exactly its limit
//!   minus what is held and spent, and every decision is the one that
//!   arithmetic predicts;
//! - no overspend: over any run, what was granted never exceeds the burst plus
//!   the refill over the elapsed time (plus the overage Commits reported);
//! - refill never exceeds capacity, and a lease never outlives its count.

use ctxbudget::config::Settings;
use ctxbudget::domain::Level;
use ctxbudget::domain::bucket::BucketSpec;
use ctxbudget::domain::decision::Reading;
use ctxbudget::domain::plan::{
    LeasePolicy, LevelPlan, Prepared, ReservePlan, ReserveRequest, Terms, prepare,
};
use ctxbudget::domain::{
    Dimension, ManualClock, Priorities, Priority, PromptCount, PromptInput, TenantId,
};
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::{ReserveReply, Retention, Scope, SettleReply, Settlement, Store};
use proptest::prelude::*;

use crate::support;

const PERIOD_S: u64 = 60;
const LEASE_MS: u64 = 30_000;

#[derive(Clone, Debug)]
enum Op {
    Reserve { prompt: u64, output: u64 },
    Commit { pick: usize, actual: u64 },
    Refund { pick: usize },
    Advance { ms: u64 },
}

fn ops(tokens: u64, advance: bool) -> impl Strategy<Value = Vec<Op>> {
    let reserve = (1..=tokens + tokens / 5, 1..=tokens / 2 + 1)
        .prop_map(|(prompt, output)| Op::Reserve { prompt, output });
    let commit = (any::<usize>(), 0..=tokens + tokens / 2)
        .prop_map(|(pick, actual)| Op::Commit { pick, actual });
    let refund = any::<usize>().prop_map(|pick| Op::Refund { pick });
    let op = if advance {
        prop_oneof![
            4 => reserve,
            2 => commit,
            1 => refund,
            2 => (0..=90_000u64).prop_map(|ms| Op::Advance { ms }),
        ]
        .boxed()
    } else {
        prop_oneof![4 => reserve, 2 => commit, 1 => refund].boxed()
    };
    proptest::collection::vec(op, 1..60)
}

struct World {
    settings: Settings,
    store: MemoryStore<ManualClock>,
    clock: ManualClock,
    tenant: TenantId,
    levels: Vec<LevelPlan>,
}

impl World {
    fn new(requests: u64, tokens: u64, concurrency: u64) -> Self {
        let settings = support::settings(
            &format!(
                "[tiers.p]\nmax_context_tokens = 1000000000\ndefault_max_output_tokens = 1\n\
                 tenant = {{ requests = [{{ limit = {requests}, period = \"{PERIOD_S}s\" }}], \
                 tokens = [{{ limit = {tokens}, period = \"{PERIOD_S}s\" }}], \
                 concurrency = {concurrency} }}\n"
            ),
            None,
        );
        let clock = ManualClock::new(1_800_000_000_000_000);
        let retention = Retention {
            record_ms: 3_600_000,
            idempotency_ms: 60_000,
            samples: 10,
            ledger: None,
            alert_queue: 0,
        };
        let store =
            MemoryStore::with_clock(Keys::new(DEFAULT_PREFIX).unwrap(), retention, clock.clone());
        let tier = settings.limits.tier("p").unwrap();
        let scope = ctxbudget::domain::plan::Scope {
            tier: Some(tier),
            group: None,
            has_user: false,
            has_session: false,
            now_us: 0,
        };
        let levels = ctxbudget::domain::plan::levels(&settings.limits, scope, false);
        World {
            settings,
            store,
            clock,
            tenant: TenantId::parse("acme").unwrap(),
            levels,
        }
    }

    fn plan(&self, prompt: u64, output: u64) -> Option<ReservePlan> {
        let req = ReserveRequest {
            tenant: self.tenant.clone(),
            user: None,
            session: None,
            tier: "p".into(),
            model: "m".into(),
            fallbacks: Vec::new(),
            statuses: Default::default(),
            prompt: PromptInput::Tokens(prompt),
            max_output_tokens: output,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
            priority: Priority::Normal,
            declared: Default::default(),
        };
        let terms = Terms {
            limits: &self.settings.limits,
            tier: self.settings.limits.tier("p").unwrap(),
            leases: LeasePolicy {
                default_ttl_ms: LEASE_MS,
                max_ttl_ms: LEASE_MS,
            },
            priorities: Priorities::default(),
            now_us: 0,
        };
        match prepare(&req, &req.model, &PromptCount::given(prompt), &terms).unwrap() {
            Prepared::Plan(plan) => Some(plan),
            Prepared::Refused { .. } => None,
        }
    }

    /// (requests level, tokens level, live leases), levels in thousandths.
    async fn read(&self) -> (i64, i64, u64) {
        let scope = Scope {
            tenant: &self.tenant,
            user: None,
            session: None,
        };
        let readings = self.store.status(scope, &self.levels, true).await.unwrap();
        let mut checks = Vec::new();
        for lp in &self.levels {
            checks.extend(lp.buckets.iter().map(|b: &BucketSpec| Some(b.dimension)));
            if lp.concurrency.is_some() {
                checks.push(None);
            }
        }
        let (mut r, mut t, mut c) = (0, 0, 0);
        for (check, reading) in checks.iter().zip(readings) {
            match (check, reading) {
                (Some(Dimension::Requests), Reading::Bucket { milli }) => r = milli,
                (Some(Dimension::Tokens), Reading::Bucket { milli }) => t = milli,
                (None, Reading::Concurrency { active, .. }) => c = active,
                other => panic!("unexpected reading {other:?}"),
            }
        }
        (r, t, c)
    }

    fn settlement<'a>(&'a self, plan: &'a ReservePlan) -> Settlement<'a> {
        Settlement {
            id: &plan.id,
            levels: &self.levels,
        }
    }
}

/// A reservation the run holds.
struct Held {
    plan: ReservePlan,
    tokens: u64,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Refill is capped at capacity and never drains; a surplus never overfills.
    #[test]
    fn refill_never_exceeds_capacity(
        limit in 1u64..1_000_000_000_000,
        period_secs in 1u64..2_592_000,
        level in -1e15f64..1e12,
        elapsed_us in any::<i64>(),
        more_us in 0i64..1_000_000_000_000,
        surplus in 1i64..1_000_000_000_000,
    ) {
        let b = BucketSpec { level: Level::Tenant, dimension: Dimension::Tokens, limit, period_secs, group: 0, window: None, alert_at: Default::default() };
        let level = level.min(limit as f64);
        let once = b.refill(level, elapsed_us);
        prop_assert!(once <= limit as f64);
        prop_assert!(once >= level);
        let later = b.refill(level, elapsed_us.max(0).saturating_add(more_us));
        prop_assert!(later >= once, "refill is monotone in time");
        prop_assert!(b.settle(once, -surplus as f64) <= limit as f64, "a surplus never overfills");
        prop_assert!(b.until_full_us(once) as f64 >= 0.0);
    }

    /// With the clock still, levels are exactly limit − held − spent, and each
    /// decision is the one that arithmetic predicts.
    #[test]
    fn reserve_commit_refund_conserve_every_unit(
        (requests, tokens, concurrency, ops) in (1u64..30, 100u64..20_000, 1u64..8)
            .prop_flat_map(|(r, t, c)| (Just(r), Just(t), Just(c), ops(t, false)))
    ) {
        runtime().block_on(async {
            let w = World::new(requests, tokens, concurrency);
            let mut held: Vec<Held> = Vec::new();
            let (mut taken_requests, mut spent_tokens) = (0i64, 0i64);
            for op in ops {
                match op {
                    Op::Reserve { prompt, output } => {
                        let (r, t, c) = w.read().await;
                        let Some(plan) = w.plan(prompt, output) else {
                            prop_assert!(prompt + output > tokens, "refused only when it can never fit");
                            continue;
                        };
                        let cost = (prompt + output) as i64;
                        let fits = r >= 1000 && t >= cost * 1000 && c < concurrency;
                        let reply = w.store.reserve(&plan).await.unwrap();
                        let allowed = matches!(reply, ReserveReply::Allowed { .. });
                        prop_assert_eq!(allowed, fits, "decision vs arithmetic ({}, {}, {})", r, t, c);
                        if allowed {
                            taken_requests += 1;
                            held.push(Held { plan, tokens: prompt + output });
                        }
                    }
                    Op::Commit { pick, actual } if !held.is_empty() => {
                        let h = held.remove(pick % held.len());
                        let reply = w.store.commit(w.settlement(&h.plan), ctxbudget::store::Usage::new(actual, 0)).await.unwrap();
                        prop_assert!(matches!(reply, SettleReply::Applied { .. }), "{:?}", reply);
                        spent_tokens += actual as i64;
                        let _ = h.tokens;
                    }
                    Op::Refund { pick } if !held.is_empty() => {
                        let h = held.remove(pick % held.len());
                        let reply = w.store.refund(w.settlement(&h.plan)).await.unwrap();
                        prop_assert!(matches!(reply, SettleReply::Applied { .. }), "{:?}", reply);
                        taken_requests -= 1;
                    }
                    _ => {}
                }
                let held_tokens: i64 = held.iter().map(|h| h.tokens as i64).sum();
                let (r, t, c) = w.read().await;
                prop_assert_eq!(r, (requests as i64 - taken_requests) * 1000);
                prop_assert_eq!(t, (tokens as i64 - held_tokens - spent_tokens) * 1000);
                prop_assert_eq!(c, held.len() as u64);
            }
            Ok(())
        })?;
    }

    /// Over time: granted requests and tokens stay within burst + refill, no
    /// bucket reads above its capacity, leases never exceed the limit.
    #[test]
    fn nothing_is_ever_overspent(
        (requests, tokens, concurrency, ops) in (1u64..30, 100u64..20_000, 1u64..8)
            .prop_flat_map(|(r, t, c)| (Just(r), Just(t), Just(c), ops(t, true)))
    ) {
        runtime().block_on(async {
            let w = World::new(requests, tokens, concurrency);
            let mut held: Vec<Held> = Vec::new();
            let (mut granted, mut charged, mut overage, mut elapsed_ms) = (0u64, 0i64, 0i64, 0u64);
            for op in ops {
                match op {
                    Op::Reserve { prompt, output } => {
                        let Some(plan) = w.plan(prompt, output) else { continue };
                        if let ReserveReply::Allowed { .. } = w.store.reserve(&plan).await.unwrap() {
                            granted += 1;
                            charged += (prompt + output) as i64;
                            held.push(Held { plan, tokens: prompt + output });
                        }
                    }
                    Op::Commit { pick, actual } if !held.is_empty() => {
                        let h = held.remove(pick % held.len());
                        w.store.commit(w.settlement(&h.plan), ctxbudget::store::Usage::new(actual, 0)).await.unwrap();
                        charged += actual as i64 - h.tokens as i64;
                        overage += (actual as i64 - h.tokens as i64).max(0);
                    }
                    Op::Refund { pick } if !held.is_empty() => {
                        let h = held.remove(pick % held.len());
                        w.store.refund(w.settlement(&h.plan)).await.unwrap();
                        charged -= h.tokens as i64;
                        granted -= 1;
                    }
                    Op::Advance { ms } => {
                        w.clock.advance_us(ms as i64 * 1000);
                        elapsed_ms += ms;
                    }
                    _ => {}
                }
                let refill = |limit: u64| limit as f64 * elapsed_ms as f64 / (PERIOD_S * 1000) as f64;
                prop_assert!(granted as f64 <= requests as f64 + refill(requests) + 1e-6,
                    "requests overspent: {} granted, limit {} over {} ms", granted, requests, elapsed_ms);
                prop_assert!(charged as f64 <= tokens as f64 + refill(tokens) + overage as f64 + 1e-6,
                    "tokens overspent: {} charged, limit {} over {} ms", charged, tokens, elapsed_ms);
                let (r, t, c) = w.read().await;
                prop_assert!(r <= requests as i64 * 1000 && t <= tokens as i64 * 1000, "over capacity");
                prop_assert!(c <= concurrency && c <= held.len() as u64, "leases {} of {}", c, concurrency);
            }
            Ok(())
        })?;
    }
}
