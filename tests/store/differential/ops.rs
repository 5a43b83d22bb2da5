//! The operations of a differential run and how they are drawn: a seeded
//! [`StdRng`] over the run's current configuration and what it has issued, so
//! a seed replays the same sequence.

use ctxbudget::domain::alert::Thresholds;
use ctxbudget::domain::bucket::{BucketSpec, Windowed};
use ctxbudget::domain::budget::ledger::Period;
use ctxbudget::domain::budget::{ChargePlan, Usage};
use ctxbudget::domain::mix::{self, PromptMix};
use ctxbudget::domain::output::OverrunCredit;
use ctxbudget::domain::price::Rates;
use ctxbudget::domain::window::{Window, WindowKind};
use ctxbudget::domain::{
    DimMap, Dimension, IdempotencyKey, Level, LevelLimits, LevelPlan, ModelGroup, ReservationId,
    ReservePlan, SessionId, TenantId, UserId,
};
use ctxbudget::store::{AlertDone, QueuedAlert};
use rand::Rng;
use rand::rngs::StdRng;
use std::sync::{Arc, LazyLock};

/// The model group whose limits join the levels' (tagged buckets, slots).
pub(super) static GROUP: LazyLock<Arc<ModelGroup>> = LazyLock::new(|| {
    Arc::new(ModelGroup {
        name: "g-diff".into(),
        patterns: vec!["m*".into()],
        context_window: None,
        cached_input_counts: false,
        global: LevelLimits::default(),
    })
});

/// One step, the same on both stores.
#[derive(Clone, Debug)]
pub(super) enum Op {
    /// Several reservations at one instant (one TTL check after them all).
    Reserve(Vec<ReservePlan>),
    /// Fallback candidates of one request (`Store::reserve_first`): the
    /// first with room is reserved.
    ReserveFirst(Vec<ReservePlan>),
    Commit {
        id: ReservationId,
        levels: Vec<LevelPlan>,
        /// The usage, its parts drawn within their wholes.
        usage: Usage,
    },
    Refund {
        id: ReservationId,
        levels: Vec<LevelPlan>,
    },
    Renew {
        id: ReservationId,
        levels: Vec<LevelPlan>,
        ttl_ms: u64,
    },
    Status {
        tenant: TenantId,
        user: Option<UserId>,
        session: Option<SessionId>,
        levels: Vec<LevelPlan>,
        exact: bool,
    },
    /// Requests or tokens taken with no reservation (Envoy's protocol).
    Charge(ChargePlan),
    Samples(Vec<String>),
    /// A tenant's ledger rows of some hours and days around now.
    Ledger(TenantId, Vec<Period>),
    /// A sender claims the due threshold alerts.
    ClaimAlerts {
        max: usize,
        claim_ms: u64,
    },
    /// A sender finishes one it claimed (an index into [`Gen::claimed`]).
    FinishAlert {
        which: usize,
        done: AlertDone,
    },
    /// Moves the clock by this many µs.
    Advance(i64),
    /// The configuration of one entry (index into [`Gen::config`]) changes
    /// (no store call): the buckets of the old one become another
    /// configuration's, "foreign", in the state.
    Reconfigure(usize, LevelPlan),
}

const TENANTS: [&str; 3] = ["acme", "beta", "t{1}:x"];
const USERS: [&str; 3] = ["alice", "bob", "mallory"];
/// Sessions, under a user or under none: ids that look like key syntax or
/// a hash tag, one not ASCII, one that is also a user's id.
const SESSIONS: [&str; 4] = ["run-1", "s:{1}", "ü", "alice"];
const TIERS: [&str; 2] = ["t", "t2"];
const ESTIMATORS: [&str; 3] = ["", "m1", "m2"];
const GROUPS: [&str; 3] = ["", "gpt-4o", "mini"];
const PERIODS: [u64; 8] = [1, 2, 5, 10, 30, 60, 3600, 86400];
const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];

/// How many entries [`Gen::config`] has: four levels, each with its group's slots.
pub(super) const ENTRIES: usize = 8;

/// Whose levels an operation uses: a tenant, and maybe a user and a session
/// (of that user, or of the tenant's calls naming none).
#[derive(Clone, Copy, Debug)]
struct Who {
    tenant: &'static str,
    user: Option<&'static str>,
    session: Option<&'static str>,
}

impl Who {
    fn tenant(&self) -> TenantId {
        TenantId::parse(self.tenant).unwrap()
    }

    fn user(&self) -> Option<UserId> {
        self.user.map(|u| UserId::parse(u).unwrap())
    }

    fn session(&self) -> Option<SessionId> {
        self.session.map(|s| SessionId::parse(s).unwrap())
    }
}

/// What an operation is drawn from.
pub(super) struct Gen {
    pub rng: StdRng,
    /// Global, tenant, user and session limits now, each followed by the
    /// model group's slots at that level.
    pub config: [LevelPlan; ENTRIES],
    /// Every reservation sent, settled or not, allowed or not.
    pub issued: Vec<ReservePlan>,
    /// The ids of reservations a store took (live, settled or lapsed), with
    /// their lease expiry (µs) as last reserved or renewed.
    pub taken: Vec<(ReservationId, i64)>,
    /// The alerts claimed last, for a later finish.
    pub claimed: Vec<QueuedAlert>,
    /// How often the configuration changes, beyond the usual few percent.
    pub churn: f64,
    /// Crowded with long leases: bursts of reservations, generous buckets.
    pub crowd: bool,
    /// The time of the operation being drawn (µs): calendar windows' spans
    /// are computed around it, or around a time up to 3 hours before (a plan
    /// made before the store's clock crossed a boundary).
    pub now: i64,
}

/// Calendar windows whose first boundary falls 1 and 2 hours after the run's
/// start (08:00 UTC), and two that stay put.
fn windows() -> [Window; 4] {
    let zone = |name: &str| ctxbudget::domain::window::parse_zone(name).unwrap();
    [
        Window {
            kind: WindowKind::Day,
            tz: zone("America/Anchorage"),
        },
        Window {
            kind: WindowKind::Day,
            tz: zone("Pacific/Kiritimati"),
        },
        Window {
            kind: WindowKind::Week,
            tz: zone("UTC"),
        },
        Window {
            kind: WindowKind::Month,
            tz: zone("Asia/Bangkok"),
        },
    ]
}

pub(super) fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len())]
}

/// Random limits for config entry `i`: a level (even `i`) or the model
/// group's slots at a level (odd `i`); at the session level, with a random
/// `session_ttl` as its key's longest life past a write.
pub(super) fn entry_plan(rng: &mut StdRng, i: usize) -> LevelPlan {
    let level = Level::ALL[i / 2];
    let plan = match i % 2 {
        0 => level_plan(rng, level),
        _ => LevelPlan {
            level,
            group: Some(GROUP.clone()),
            slots: true,
            buckets: Vec::new(),
            concurrency: match rng.random_range(0..10) {
                0..=5 => None,
                6..=8 => Some(rng.random_range(1..=4)),
                _ => Some(rng.random_range(20..=100)),
            },
            overrun: None,
            idle_secs: None,
        },
    };
    LevelPlan {
        idle_secs: (level == Level::Session).then(|| session_ttl(rng)),
        ..plan
    }
}

/// A session's `session_ttl` (s): short, so its keys lapse within a run;
/// one of the buckets' usual periods; or hours, longer than most refills.
fn session_ttl(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..3) {
        0 => rng.random_range(1..=5),
        1 => *pick(rng, &PERIODS),
        _ => rng.random_range(3_600..=48 * 3_600),
    }
}

/// Random limits for one level — every rate dimension, some of them the
/// model group's (tagged) — sometimes none at all.
pub(super) fn level_plan(rng: &mut StdRng, level: Level) -> LevelPlan {
    if rng.random_bool(0.15) {
        return LevelPlan {
            level,
            group: None,
            slots: false,
            buckets: Vec::new(),
            concurrency: None,
            overrun: None,
            idle_secs: None,
        };
    }
    let mut buckets = Vec::new();
    let tags = [0, GROUP.tag()];
    // Every rate dimension, each with limits of its scale: tokens, µ$, or a
    // count (requests, images).
    let ranges = |d: Dimension| match d {
        d if d.is_tokens() => (50..=3000, 3001..=2_000_000),
        d if d.is_priced() => (100..=50_000, 50_001..=100_000_000),
        _ => (1..=8u64, 9..=1000u64),
    };
    for ((dimension, (small, large)), group) in Dimension::RATES
        .into_iter()
        .map(|d| (d, ranges(d)))
        .flat_map(|d| tags.map(|t| (d.clone(), t)))
    {
        // All-model requests and tokens as before; the other kinds and the
        // group's limits less often, so plans stay small.
        let rare = group != 0 || !matches!(dimension, Dimension::Requests | Dimension::Tokens);
        if rare && rng.random_bool(0.6) {
            continue;
        }
        let mut periods = Vec::new();
        for _ in 0..rng.random_range(0..=3) {
            // Mostly the usual periods; any of 120 others, so that changed
            // configurations leave more foreign buckets than a state keeps.
            let period_secs = match rng.random_bool(0.5) {
                true => *pick(rng, &PERIODS),
                false => rng.random_range(1..=120),
            };
            if periods.contains(&period_secs) {
                continue;
            }
            periods.push(period_secs);
            let limit = if rng.random_bool(0.6) {
                rng.random_range(small.clone())
            } else {
                rng.random_range(large.clone())
            };
            buckets.push(BucketSpec {
                level,
                dimension,
                limit,
                period_secs,
                group,
                window: None,
                alert_at: thresholds(rng),
            });
        }
        // Sometimes one calendar window of this dimension too (its span is
        // filled in when the level is used).
        if rng.random_bool(0.25) {
            let window = *pick(rng, &windows());
            buckets.push(BucketSpec {
                level,
                dimension,
                limit: rng.random_range(small.clone()),
                period_secs: 0,
                group,
                window: Some(Windowed {
                    window,
                    span: window.span(0),
                }),
                alert_at: thresholds(rng),
            });
        }
    }
    let concurrency = match rng.random_range(0..10) {
        0..=3 => None,
        4..=7 => Some(rng.random_range(1..=4)),
        _ => Some(rng.random_range(20..=100)),
    };
    let grouped = buckets.iter().any(|b| b.group != 0);
    // A learned output's credit below the global level (a cluster's global
    // share holds the whole grant: docs/cluster.md), small or large.
    let overrun = (level != Level::Global && rng.random_bool(0.5)).then(|| OverrunCredit {
        capacity: match rng.random_bool(0.5) {
            true => rng.random_range(0..=400),
            false => rng.random_range(401..=1_000_000),
        },
        period_secs: *pick(rng, &PERIODS),
    });
    LevelPlan {
        level,
        group: grouped.then(|| GROUP.clone()),
        slots: false,
        buckets,
        concurrency,
        overrun,
        idle_secs: None,
    }
}

/// A bucket's alert thresholds: mostly none; the usual ones, or odd
/// fractions (above the limit too: debt).
fn thresholds(rng: &mut StdRng) -> Thresholds {
    let fractions: &[f64] = match rng.random_range(0..10) {
        0..=5 => &[],
        6 => &[0.8],
        7 => &[0.5, 0.8, 0.95, 1.0],
        8 => &[0.1, 0.3333, 0.9999],
        _ => &[1.0, 1.5, 2.0],
    };
    Thresholds::new(fractions).unwrap()
}

/// A lease or renewal length (ms): tiny ones lapse at once, long ones outlive
/// retention.
fn ttl_ms(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..4) {
        0 => rng.random_range(1..=50),
        1 | 2 => rng.random_range(100..=3000),
        _ => rng.random_range(10_000..=60_000),
    }
}

impl Gen {
    /// The levels of (tenant, user, session) now, outermost first: the
    /// limited ones for a reservation, all of them (`keep_unlimited`) for a
    /// settlement. Without a user, its entries are left out (a session then
    /// follows the tenant's).
    pub(super) fn levels(
        &mut self,
        user: bool,
        session: bool,
        keep_unlimited: bool,
    ) -> Vec<LevelPlan> {
        let named = [true, true, user, session];
        let at = match self.rng.random_bool(0.3) {
            true => self.now - self.rng.random_range(0..=3 * 3_600_000_000),
            false => self.now,
        };
        let mut levels: Vec<LevelPlan> = self
            .config
            .iter()
            .enumerate()
            .filter(|(i, _)| named[i / 2])
            .map(|(_, l)| l)
            .filter(|l| keep_unlimited || !l.is_unlimited())
            .cloned()
            .collect();
        for b in levels.iter_mut().flat_map(|l| &mut l.buckets) {
            if let Some(w) = &mut b.window {
                w.span = w.window.span(at);
            }
        }
        levels
    }

    fn id(&mut self, who: Who, tier: &str, est: &str) -> ReservationId {
        let mut id = ReservationId::generate(who.tenant(), who.user(), tier.into(), est.into())
            .with_session(who.session());
        id.nonce = self.rng.random();
        // The model group names the ledger's rows.
        id.group = pick(&mut self.rng, &GROUPS).to_string();
        id
    }

    /// A tenant; most often one of its users; sometimes a session, of the
    /// user or of the tenant's calls naming none.
    fn scope(&mut self) -> Who {
        let tenant = *pick(&mut self.rng, &TENANTS);
        let user = if self.rng.random_bool(0.7) {
            Some(*pick(&mut self.rng, &USERS[..2]))
        } else {
            None
        };
        let session = match self.rng.random_bool(0.35) {
            true => Some(*pick(&mut self.rng, &SESSIONS)),
            false => None,
        };
        Who {
            tenant,
            user,
            session,
        }
    }

    /// A new request, or a retry of an earlier one under its idempotency key
    /// (the same id, or a new id as the service gives a retried call).
    fn reservation(&mut self) -> ReservePlan {
        let keyed: Vec<&ReservePlan> = self
            .issued
            .iter()
            .filter(|p| p.idempotency_key.is_some())
            .collect();
        if !keyed.is_empty() && self.rng.random_bool(0.12) {
            let mut retry = (*pick(&mut self.rng, &keyed)).clone();
            if self.rng.random_bool(0.5) {
                retry.id.nonce = self.rng.random();
            }
            let (user, session) = (retry.id.user.is_some(), retry.id.session.is_some());
            retry.levels = self.levels(user, session, false);
            return retry;
        }
        let who = self.scope();
        let tier = *pick(&mut self.rng, &TIERS);
        let estimator = *pick(&mut self.rng, &ESTIMATORS);
        let id = self.id(who, tier, estimator);
        let levels = self.levels(who.user.is_some(), who.session.is_some(), false);
        let mut plan = self.sized(id, levels);
        let r = &mut self.rng;
        plan.idempotency_key = r
            .random_bool(0.35)
            .then(|| IdempotencyKey::parse(KEYS[r.random_range(0..KEYS.len())]).unwrap());
        plan
    }

    /// Fallback candidates: 2–4 plans of one request for different models,
    /// as the service plans them (one scope and tier, one lease, output and
    /// priority; a prompt, estimator, price and id of each model's own; no
    /// idempotency key). The first mostly under the model group's limits
    /// too, the later ones less often (another model's, or a model of no
    /// group: the all-model limits only), so an earlier candidate is often
    /// denied where a later one has room.
    fn candidates(&mut self) -> Vec<ReservePlan> {
        let who = self.scope();
        let tier = *pick(&mut self.rng, &TIERS);
        let levels = self.levels(who.user.is_some(), who.session.is_some(), false);
        let n = self.rng.random_range(2..=4);
        let mut plans: Vec<ReservePlan> = Vec::with_capacity(n);
        for k in 0..n {
            let estimator = *pick(&mut self.rng, &ESTIMATORS);
            let id = self.id(who, tier, estimator);
            let grouped = self.rng.random_bool(if k == 0 { 0.8 } else { 0.35 });
            let levels = match grouped {
                true => levels.clone(),
                false => all_model(&levels),
            };
            let mut plan = self.sized(id, levels);
            if let Some(first) = plans.first() {
                plan.lease_ttl_ms = first.lease_ttl_ms;
                plan.headroom = first.headroom;
                plan.max_output_tokens = first.max_output_tokens;
                plan.min_output_tokens = first.min_output_tokens;
                plan.learned_output = plan
                    .learned_output
                    .map(|l| l.min(first.max_output_tokens.max(1) + 5));
            }
            plans.push(plan);
        }
        plans
    }

    /// A new request of `id` on `levels`, with no idempotency key.
    fn sized(&mut self, id: ReservationId, levels: Vec<LevelPlan>) -> ReservePlan {
        let estimator = !id.estimator.is_empty();
        // Sizes around the smallest token bucket, so most requests can fit.
        let cap = levels
            .iter()
            .flat_map(|l| &l.buckets)
            .filter(|b| b.dimension.is_tokens())
            .map(|b| b.limit)
            .min()
            .unwrap_or(5000)
            .clamp(2, 20_000);
        let r = &mut self.rng;
        let big = r.random_bool(0.1);
        let prompt = match r.random_range(0..5) {
            0 => 0,
            _ if big => r.random_range(0..=cap * 2),
            // A limit scaled down to 1 or 2 leaves a third of nothing.
            _ => r.random_range(1..=(cap / 3).max(1)),
        };
        let max_output = match big {
            true => r.random_range(1..=cap * 2),
            false => r.random_range(1..=(cap / 3).max(1)),
        };
        let min_output = if r.random_bool(0.3) {
            r.random_range(1..=max_output)
        } else {
            max_output
        };
        let estimated = match estimator {
            true => r.random_range(1..=3000),
            false => 0,
        };
        let headroom = match self.rng.random_range(0..10) {
            0..=6 => 0.0,
            7 => 0.1,
            8 => 0.3,
            _ => 0.05,
        };
        let grouped = levels.iter().any(|l| l.group.is_some());
        let price = match self.rng.random_range(0..4) {
            0 => Rates::default(),
            _ => {
                let input = self.rng.random_range(0..=20_000_000);
                let output: u64 = self.rng.random_range(0..=80_000_000);
                Rates {
                    cached_input: self.rng.random_range(0..=input),
                    // Reasoning dearer than output sometimes, and a fee.
                    reasoning: self.rng.random_range(0..=output.saturating_mul(2)),
                    per_call: match self.rng.random_bool(0.3) {
                        true => self.rng.random_range(1..=50_000),
                        false => 0,
                    },
                    // A price per unit of each dimension the caller counts.
                    declared: DimMap::from_fn(|d| match d.is_declared() {
                        true => self.rng.random_range(0..=40_000),
                        false => 0,
                    }),
                    ..Rates::flat(input, output)
                }
            }
        };
        // What the call declares in each dimension the caller counts:
        // mostly none, sometimes a few.
        let declared = DimMap::from_fn(|d| match d.is_declared() && self.rng.random_bool(0.5) {
            true => self.rng.random_range(1..=4),
            false => 0,
        });
        ReservePlan {
            price,
            declared,
            levels,
            model_group: grouped.then(|| GROUP.clone()),
            headroom,
            prompt_tokens: prompt,
            max_output_tokens: max_output,
            min_output_tokens: min_output,
            estimated_prompt_tokens: estimated,
            prompt_mix: (estimated > 0 && self.rng.random_bool(0.5))
                .then(|| mix(&mut self.rng, estimated)),
            learned_output: match self.rng.random_range(0..3) {
                0 => None,
                _ => Some(self.rng.random_range(1..=max_output.max(1) + 5)),
            },
            lease_ttl_ms: ttl_ms(&mut self.rng),
            idempotency_key: None,
            fingerprint: self.rng.random_range(0..4),
            id,
        }
    }

    /// An id to settle or renew: mostly one issued (live, settled or lapsed),
    /// sometimes a hostile one — unknown, edited, or another owner's.
    /// Often the one whose lease lapses nearest to now: the clock tends to
    /// land on lease expiries, and this settles or renews right at them.
    fn target(&mut self, now: i64) -> ReservationId {
        if self.issued.is_empty() || self.rng.random_bool(0.15) {
            return self.hostile();
        }
        if !self.taken.is_empty() && self.rng.random_bool(0.3) {
            let nearest = self.taken.iter().min_by_key(|(_, e)| (e - now).abs());
            return nearest.unwrap().0.clone();
        }
        if !self.taken.is_empty() && self.rng.random_bool(0.8) {
            return pick(&mut self.rng, &self.taken).0.clone();
        }
        pick(&mut self.rng, &self.issued).id.clone()
    }

    /// An unknown id, or an issued one edited: another user or none,
    /// another tier, tenant or session, a session dropped or added, a
    /// nonce bit flipped.
    /// True when `id` is an issued reservation's but for its session.
    pub(super) fn other_session(&self, id: &ReservationId) -> bool {
        self.issued.iter().any(|p| {
            (&p.id.tenant, p.id.nonce) == (&id.tenant, id.nonce) && p.id.session != id.session
        })
    }

    fn hostile(&mut self) -> ReservationId {
        let who = self.scope();
        if self.issued.is_empty() {
            return self.id(who, "t", "");
        }
        let i = self.rng.random_range(0..self.issued.len());
        let mut id = self.issued[i].id.clone();
        match self.rng.random_range(0..8) {
            0 => return self.id(who, "t", ""),
            1 => id.user = Some(UserId::parse(USERS[2]).unwrap()),
            2 => id.user = None,
            3 => id.tier = "other".into(),
            4 => id.tenant = who.tenant(),
            5 => {
                let other: Vec<&str> = SESSIONS
                    .into_iter()
                    .filter(|s| id.session.as_ref().is_none_or(|x| x.as_str() != *s))
                    .collect();
                let s = *pick(&mut self.rng, &other);
                id.session = Some(SessionId::parse(s).unwrap());
            }
            6 if id.session.is_some() => id.session = None,
            6 => id.session = Some(SessionId::parse(SESSIONS[0]).unwrap()),
            _ => id.nonce[self.rng.random_range(0..16)] ^= 1,
        }
        id
    }

    /// The next operation; `expiries` are instants (µs) worth landing on
    /// exactly: key and lease expiries.
    pub(super) fn next(&mut self, now: i64, expiries: &[i64]) -> Op {
        self.now = now;
        if self.rng.random_bool(self.churn) {
            let i = self.rng.random_range(0..ENTRIES);
            return Op::Reconfigure(i, entry_plan(&mut self.rng, i));
        }
        if self.crowd && self.rng.random_bool(0.2) {
            let n = self.rng.random_range(10..=40);
            let mut plans: Vec<ReservePlan> = (0..n).map(|_| self.reservation()).collect();
            for p in &mut plans {
                p.lease_ttl_ms = self.rng.random_range(20_000..=60_000);
            }
            return Op::Reserve(plans);
        }
        if self.crowd && self.rng.random_bool(0.3) {
            let who = self.scope();
            return Op::Status {
                tenant: who.tenant(),
                user: who.user(),
                session: who.session(),
                levels: self.levels(who.user.is_some(), who.session.is_some(), false),
                exact: true,
            };
        }
        match self.rng.random_range(0..100) {
            0..=23 => Op::Reserve(vec![self.reservation()]),
            24..=29 => Op::ReserveFirst(self.candidates()),
            30..=32 => {
                let n = self.rng.random_range(5..=25);
                Op::Reserve((0..n).map(|_| self.reservation()).collect())
            }
            33..=44 => {
                let id = self.target(now);
                let levels = self.levels(id.user.is_some(), id.session.is_some(), true);
                let r = &mut self.rng;
                let actual = match r.random_range(0..5) {
                    0 => 0,
                    1 => r.random_range(1..=100),
                    2 => r.random_range(100..=3000),
                    3 => r.random_range(3000..=50_000),
                    _ => r.random_range(0..=5_000_000),
                };
                let prompt = match r.random_range(0..3) {
                    0 => 0,
                    _ => r.random_range(0..=actual),
                };
                // Cached prompt tokens left out of the input count, sometimes.
                let input = match r.random_range(0..3) {
                    0 => r.random_range(0..=prompt),
                    _ => prompt,
                };
                // What the ledger reports as cached.
                let cached = match prompt - input {
                    0 => r.random_range(0..=prompt / 2),
                    left_out => left_out,
                };
                let cost = match r.random_range(0..3) {
                    0 => 0,
                    1 => r.random_range(0..=1_000),
                    _ => r.random_range(0..=5_000_000),
                };
                let learn = r.random_bool(0.8);
                let output_kept = match r.random_range(0..3) {
                    0 => 0,
                    _ => r.random_range(1..=4),
                };
                // Cache writes and reasoning (the ledger's parts), sometimes:
                // rows with and without them.
                let (cache_write, cache_write_1h, reasoning) = match r.random_range(0..3) {
                    0 => {
                        let rest = prompt - cached;
                        let cache_write = r.random_range(0..=rest);
                        let cache_write_1h = r.random_range(0..=rest - cache_write);
                        (
                            cache_write,
                            cache_write_1h,
                            r.random_range(0..=actual - prompt),
                        )
                    }
                    _ => (0, 0, 0),
                };
                Op::Commit {
                    id,
                    levels,
                    usage: Usage {
                        tokens: actual,
                        prompt,
                        input,
                        cached,
                        cache_write,
                        cache_write_1h,
                        reasoning,
                        cost,
                        declared: DimMap::from_fn(|d| match d.is_declared() {
                            true => r.random_range(0..=5),
                            false => 0,
                        }),
                        learn,
                        output_kept,
                    },
                }
            }
            45..=51 => {
                let id = self.target(now);
                let levels = self.levels(id.user.is_some(), id.session.is_some(), true);
                Op::Refund { id, levels }
            }
            52..=60 => {
                let id = self.target(now);
                let levels = self.levels(id.user.is_some(), id.session.is_some(), true);
                let ttl_ms = ttl_ms(&mut self.rng);
                Op::Renew { id, levels, ttl_ms }
            }
            61..=71 => {
                let who = self.scope();
                let keep_unlimited = self.rng.random_bool(0.3);
                let (user, session) = (who.user.is_some(), who.session.is_some());
                Op::Status {
                    tenant: who.tenant(),
                    user: who.user(),
                    session: who.session(),
                    levels: self.levels(user, session, keep_unlimited),
                    exact: self.rng.random_bool(0.6),
                }
            }
            72 => Op::Samples(ESTIMATORS.iter().map(|s| s.to_string()).collect()),
            73 => {
                let tenant = self.scope().tenant;
                let (hour, day) = Period::of(now as f64);
                let (Period::Hour(h), Period::Day(d)) = (hour, day) else {
                    unreachable!("an hour and a day")
                };
                let periods = (0..3)
                    .flat_map(|back| [Period::Hour(h - back), Period::Day(d - back)])
                    .collect();
                Op::Ledger(TenantId::parse(tenant).unwrap(), periods)
            }
            74..=77 => Op::Charge(self.charge()),
            78..=92 => Op::Advance(self.advance(now, expiries)),
            93 => Op::ClaimAlerts {
                max: self.rng.random_range(1..=4),
                claim_ms: *pick(&mut self.rng, &[1, 1_000, 60_000]),
            },
            94..=95 => Op::FinishAlert {
                which: self.rng.random_range(0..4),
                done: match self.rng.random_range(0..3) {
                    0 => AlertDone::Sent,
                    1 => AlertDone::Dropped,
                    _ => AlertDone::Retry {
                        after_ms: *pick(&mut self.rng, &[1, 500, 30_000]),
                    },
                },
            },
            96..=97 => {
                let i = self.rng.random_range(0..ENTRIES);
                Op::Reconfigure(i, entry_plan(&mut self.rng, i))
            }
            _ => {
                // The same buckets under other limits (a tier change, an
                // override, a live `tiers set`): what was used is kept.
                let i = self.rng.random_range(0..ENTRIES);
                let mut plan = self.config[i].clone();
                for b in &mut plan.buckets {
                    let scale = *pick(&mut self.rng, &[0.1, 0.5, 0.9, 1.1, 2.0, 10.0]);
                    b.limit = ((b.limit as f64 * scale) as u64).max(1);
                }
                Op::Reconfigure(i, plan)
            }
        }
    }

    /// A charge: a check, some requests, or tokens forced into debt, on the
    /// levels without their concurrency limits.
    fn charge(&mut self) -> ChargePlan {
        let who = self.scope();
        let levels = self
            .levels(who.user.is_some(), who.session.is_some(), false)
            .into_iter()
            .filter(|l| !l.buckets.is_empty())
            .map(|l| LevelPlan {
                concurrency: None,
                ..l
            })
            .collect();
        let r = &mut self.rng;
        let (requests, tokens, enforce) = match r.random_range(0..4) {
            0 => (0, 0, true),
            1 => (r.random_range(1..=3), 0, true),
            2 => (0, r.random_range(1..=5_000_000), false),
            _ => (
                r.random_range(0..=2),
                r.random_range(0..=3000),
                r.random_bool(0.5),
            ),
        };
        ChargePlan {
            tenant: who.tenant(),
            user: who.user(),
            session: who.session(),
            levels,
            requests,
            tokens,
            enforce,
        }
    }

    /// How far to move the clock: a little, past refills and leases, past
    /// retention, or onto an expiry exactly (or a µs either side).
    fn advance(&mut self, now: i64, expiries: &[i64]) -> i64 {
        let future: Vec<i64> = expiries.iter().copied().filter(|&e| e > now).collect();
        let r = &mut self.rng;
        match r.random_range(0..10) {
            0 => r.random_range(0..=2_000),
            1..=3 => r.random_range(1_000..=2_000_000),
            4..=5 => r.random_range(2_000_000..=30_000_000),
            6 => r.random_range(30_000_000..=600_000_000),
            _ if future.is_empty() => r.random_range(1_000..=5_000_000),
            _ => (pick(r, &future) - now + r.random_range(-1..=1)).max(0),
        }
    }
}

/// `levels` as a model of no group meets them: the all-model buckets, no
/// group's tagged buckets or slots; levels left with no limit dropped.
fn all_model(levels: &[LevelPlan]) -> Vec<LevelPlan> {
    levels
        .iter()
        .filter(|l| !l.slots)
        .map(|l| LevelPlan {
            group: None,
            buckets: l.buckets.iter().filter(|b| b.group == 0).cloned().collect(),
            ..l.clone()
        })
        .filter(|l| !l.is_unlimited())
        .collect()
}

/// A random mix of `estimated` tokens: some groups empty, the rest shared at random.
fn mix(rng: &mut StdRng, estimated: u64) -> PromptMix {
    let mut weights = [0f64; mix::GROUPS];
    for w in &mut weights {
        if rng.random_bool(0.6) {
            *w = rng.random_range(0.0..1.0);
        }
    }
    let sum: f64 = weights.iter().sum::<f64>().max(1e-9);
    PromptMix(weights.map(|w| (w / sum * estimated as f64) as f32))
}
