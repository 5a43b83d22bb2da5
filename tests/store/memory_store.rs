//! Behaviour only the memory store can show directly: with a hand-moved clock,
//! idle state disappears exactly when Redis keys would expire.

use ctxbudget::domain::plan::{LeasePolicy, Prepared, ReserveRequest, Terms, prepare};
use ctxbudget::domain::{
    ManualClock, Priorities, Priority, PromptCount, PromptInput, TenantId, UserId,
};
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use ctxbudget::store::memory::MemoryStore;
use ctxbudget::store::{ReserveReply, Retention, SettleReply, Settlement, Store};

use crate::support;

#[tokio::test]
async fn idle_state_expires_and_memory_stays_bounded() {
    let settings = support::settings(
        r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 1000, period = "1m" }], concurrency = 5 }
user = { requests = [{ limit = 10, period = "1m" }], concurrency = 1 }
"#,
        None,
    );
    let clock = ManualClock::new(1_800_000_000_000_000);
    let retention = Retention {
        record_ms: 1_000,
        idempotency_ms: 1_000,
        samples: 100,
        ledger: None,
        alert_queue: 0,
    };
    let store =
        MemoryStore::with_clock(Keys::new(DEFAULT_PREFIX).unwrap(), retention, clock.clone());
    let leases = LeasePolicy {
        default_ttl_ms: 5_000,
        max_ttl_ms: 5_000,
    };
    let tier = settings.limits.tier("t").unwrap().clone();
    for i in 0..1000 {
        let req = ReserveRequest {
            tenant: TenantId::parse(&format!("tenant-{i}")).unwrap(),
            user: Some(UserId::parse("u").unwrap()),
            session: None,
            tier: "t".into(),
            model: "m".into(),
            fallbacks: Vec::new(),
            statuses: Default::default(),
            prompt: PromptInput::Tokens(90),
            max_output_tokens: 10,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
            priority: Priority::Normal,
            declared: Default::default(),
        };
        let terms = Terms {
            limits: &settings.limits,
            tier: &tier,
            leases,
            priorities: Priorities::default(),
            now_us: 0,
        };
        let Prepared::Plan(plan) =
            prepare(&req, &req.model, &PromptCount::given(90), &terms).unwrap()
        else {
            panic!("planned");
        };
        assert!(matches!(
            store.reserve(&plan).await.unwrap(),
            ReserveReply::Allowed { .. }
        ));
        if i % 2 == 0 {
            let scope = ctxbudget::domain::plan::Scope {
                tier: settings.limits.tier("t").map(|t| t.as_ref()),
                group: None,
                has_user: true,
                has_session: false,
                now_us: 0,
            };
            let levels = ctxbudget::domain::plan::levels(&settings.limits, scope, true);
            let s = Settlement {
                id: &plan.id,
                levels: &levels,
            };
            assert!(matches!(
                store
                    .commit(s, ctxbudget::store::Usage::new(120, 90))
                    .await
                    .unwrap(),
                SettleReply::Applied { .. }
            ));
        }
    }
    assert_eq!(
        store.key_count(),
        3000,
        "tenant level, user level and record per reservation"
    );
    // Buckets refill within 7 s, leases lapse after 5 s and their records 1 s
    // later; keys live twice what they need plus a second.
    clock.advance_us(3_000_000);
    let left = store.key_count();
    assert!(
        left >= 2000,
        "3 s in, buckets and leases still need state: {left}"
    );
    clock.advance_us(57_000_000);
    assert_eq!(store.key_count(), 0, "idle state must expire");
}

/// The engine itself refuses more candidates than one call may name (the
/// API refuses them first): a library caller gets INVALID_ARGUMENT's error,
/// and nothing is reserved.
#[tokio::test]
async fn the_engine_refuses_too_many_candidates_and_reserves_nothing() {
    let settings = support::settings(
        r#"
[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100, period = "1m" }] }
"#,
        None,
    );
    let store = MemoryStore::new(Keys::new(DEFAULT_PREFIX).unwrap(), settings.retention);
    let engine = ctxbudget::server::engine(store, &settings);
    let ask = |fallbacks: usize| ReserveRequest {
        tenant: TenantId::parse("t1").unwrap(),
        user: None,
        session: None,
        tier: "t".into(),
        model: "m-0".into(),
        fallbacks: (1..=fallbacks).map(|i| format!("m-{i}")).collect(),
        statuses: Default::default(),
        prompt: PromptInput::Tokens(5),
        max_output_tokens: 5,
        min_output_tokens: None,
        idempotency_key: None,
        lease_ttl_ms: None,
        priority: Priority::Normal,
        declared: Default::default(),
    };
    let refused = engine.reserve(ask(40)).await.unwrap_err();
    assert!(
        matches!(refused, ctxbudget::engine::EngineError::Invalid(_)),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("at most 8"), "{refused}");
    assert_eq!(engine.store().key_count(), 0, "nothing was reserved");
    // Eight models in all is the most, and is served.
    let served = engine.reserve(ask(7)).await.unwrap();
    assert!(served.denial.is_none(), "{served:?}");
    assert_eq!(served.chosen_model.as_deref(), Some("m-0"));
}
