//! Criterion benches of the hot paths: decision arithmetic, key building, state
//! encoding and the memory store's reserve + commit.

use criterion::{Criterion, criterion_group, criterion_main};
use ctxbudget_server::config::FileConfig;
use ctxbudget_server::domain::bucket::Cost;
use ctxbudget_server::domain::budget::ledger::LedgerRetention;
use ctxbudget_server::domain::budget::state::LevelState;
use ctxbudget_server::domain::plan::{self, LeasePolicy, Prepared, ReserveRequest, Terms};
use ctxbudget_server::domain::{
    Level, Priorities, Priority, PromptCount, PromptInput, Reading, TenantId, UserId, decision,
};
use ctxbudget_server::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget_server::store::memory::MemoryStore;
use ctxbudget_server::store::{Retention, Scope, Settlement, Store, Usage};
use std::hint::black_box;

fn request(i: u64) -> ReserveRequest {
    ReserveRequest {
        tenant: TenantId::parse(&format!("tenant-{}", i % 1000)).unwrap(),
        user: Some(UserId::parse(&format!("user-{}", i % 10_000)).unwrap()),
        session: None,
        tier: "enterprise".into(),
        model: "gpt-4o".into(),
        fallbacks: Vec::new(),
        statuses: Default::default(),
        prompt: PromptInput::Tokens(1000),
        max_output_tokens: 500,
        min_output_tokens: None,
        idempotency_key: None,
        lease_ttl_ms: None,
        priority: Priority::Normal,
        declared: Default::default(),
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "the list of benches, one group after another"
)]
fn benches(c: &mut Criterion) {
    let settings = FileConfig::built_in().settings(Default::default()).unwrap();
    let limits = settings.limits.clone();
    let tier = limits.tier("enterprise").unwrap().clone();
    let terms = Terms {
        limits: &limits,
        tier: &tier,
        leases: LeasePolicy {
            default_ttl_ms: 120_000,
            max_ttl_ms: 900_000,
        },
        priorities: Priorities::default(),
        now_us: 0,
    };
    let count = PromptCount::given(1000);
    let prepare = |i| {
        let req = request(i);
        plan::prepare(&req, &req.model, &count, &terms).unwrap()
    };
    let Prepared::Plan(sample) = prepare(1) else {
        panic!("the sample request plans");
    };
    let readings: Vec<Reading> = sample
        .levels
        .iter()
        .flat_map(|l| {
            let buckets = l
                .buckets
                .iter()
                .map(|_| Reading::Bucket { milli: 1_000_000 });
            let conc = l.concurrency.map(|_| Reading::Concurrency {
                active: 3,
                earliest_expiry_ms: 500,
            });
            buckets.chain(conc).collect::<Vec<_>>()
        })
        .collect();

    c.bench_function("plan/prepare (3 levels)", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            black_box(prepare(i))
        })
    });
    c.bench_function("decision/limit_states", |b| {
        b.iter(|| black_box(decision::limit_states(&sample.levels, &readings)))
    });
    c.bench_function("decision/denial", |b| {
        b.iter(|| {
            black_box(decision::denial(
                &sample.levels,
                &readings,
                0b110.into(),
                Cost::reservation(1000, 500, 0, &Default::default()),
                0.0,
                1000,
            ))
        })
    });
    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    c.bench_function("keys/user level", |b| {
        b.iter(|| black_box(keys.level(Level::User, Scope::of(&sample.id))))
    });
    let state = LevelState {
        n: 3.0,
        e: 1.8e15,
        x: 1.9e15,
        ..LevelState::default()
    };
    let bytes = state.encode();
    c.bench_function("state/decode", |b| {
        b.iter(|| black_box(LevelState::decode(&bytes).unwrap()))
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = MemoryStore::new(
        keys.clone(),
        Retention {
            record_ms: 1_000,
            idempotency_ms: 1_000,
            samples: 100,
            // The ledger on, as by default.
            ledger: Some(LedgerRetention {
                hourly_us: 35 * 86_400_000_000,
                daily_us: 400 * 86_400_000_000,
            }),
            alert_queue: 1_000,
        },
    );
    let scope = plan::Scope {
        tier: limits.tier("enterprise").map(|t| t.as_ref()),
        group: None,
        has_user: true,
        has_session: false,
        now_us: 0,
    };
    let all_levels = plan::levels(&limits, scope, true);
    c.bench_function("memory store/reserve + commit", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            let Prepared::Plan(p) = prepare(i) else {
                unreachable!()
            };
            rt.block_on(async {
                black_box(store.reserve(&p).await.unwrap());
                let s = Settlement {
                    id: &p.id,
                    levels: &all_levels,
                };
                black_box(store.commit(s, Usage::new(1200, 1000)).await.unwrap());
            })
        })
    });
}

criterion_group!(hot_paths, benches);
criterion_main!(hot_paths);
