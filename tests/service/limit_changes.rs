//! A change of limit keeps what was used, not what was left: a tenant moved
//! to a bigger tier gets the bigger allowance less its use, and to a smaller
//! one the smaller allowance less its use — below zero, owed like debt, when
//! it used more — so moving back and forth forgives nothing. The same for a
//! live `tiers set`, an override with a reservation in flight, and the global
//! level (on a cluster, the share each replica leases from it). On every
//! store.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Reason};
use std::time::{Duration, Instant};
use support::{Backend, Harness, reserve};

on_every_store!(
    a_tenant_moved_to_another_tier_keeps_its_use,
    live_changes_of_a_limit_keep_the_use,
);

const CONFIG: &str = r#"
[tiers.free]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 5000, period = "1d" }] }

[tiers.pro]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 100000, period = "1d" }] }

[tiers.tiny]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000, period = "1d" }] }
"#;

/// A daily limit refills 1/86400 of itself per second: what a test's few
/// seconds may add.
const SLACK: i64 = 20;

/// Uses `prompt + completion` tokens of the tenant on `tier`.
async fn spend(h: &mut Harness, tenant: &str, tier: &str, prompt: u64, completion: u64) {
    let r = h
        .client
        .check_and_reserve(reserve(tenant, "", tier, prompt, completion))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:#?}");
    h.client
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id,
            prompt_tokens: prompt,
            completion_tokens: completion,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// The tenant's (or the global level's) daily tokens left and the limit.
async fn left(h: &mut Harness, tenant: &str, tier: &str, level: Level) -> (i64, u64) {
    let status = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: tenant.into(),
            tier: tier.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let l = support::limit(&status.limits, level, Dimension::Tokens, 86_400);
    (l.remaining, l.limit)
}

fn assert_left(got: (i64, u64), want: i64, limit: u64, what: &str) {
    assert_eq!(got.1, limit, "{what}: the limit");
    assert!(
        got.0 >= want && got.0 <= (want + SLACK).min(limit as i64),
        "{what}: {} left of {}, want {want} (what was used is kept)",
        got.0,
        got.1
    );
}

async fn a_tenant_moved_to_another_tier_keeps_its_use(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    spend(&mut h, "acme", "free", 1000, 100).await;
    let free = left(&mut h, "acme", "free", Level::Tenant).await;
    assert_left(free, 3900, 5000, "on free");
    // Moved up: 100000 less the 1100 used, not the 3900 left on free.
    let pro = left(&mut h, "acme", "pro", Level::Tenant).await;
    assert_left(pro, 98_900, 100_000, "moved to pro");
    spend(&mut h, "acme", "pro", 2000, 0).await;
    assert_left(
        left(&mut h, "acme", "pro", Level::Tenant).await,
        96_900,
        100_000,
        "after a request on pro",
    );
    // Moved down below its use: 3,100 used of 1,000, so 2,100 owed, and
    // denied.
    assert_left(
        left(&mut h, "acme", "tiny", Level::Tenant).await,
        -2100,
        1000,
        "moved to tiny",
    );
    let r = h
        .client
        .check_and_reserve(reserve("acme", "", "tiny", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.allowed && r.reason() == Reason::TpmExceeded, "{r:#?}");
    // Back on free: 5000 less the 3100 used.
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        1900,
        5000,
        "back on free",
    );
    spend(&mut h, "acme", "free", 900, 0).await;
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        1000,
        5000,
        "after a request on free",
    );
    h.stop().await;
}

/// Waits until the tokens limit the service applies is `limit`.
async fn until_limit(h: &mut Harness, tenant: &str, tier: &str, level: Level, limit: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while left(h, tenant, tier, level).await.1 != limit {
        assert!(Instant::now() < deadline, "the change never applied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn live_changes_of_a_limit_keep_the_use(backend: Backend) {
    if let Backend::Memory = backend {
        // The memory store has no shared configuration to change live; the
        // tier change above covers its arithmetic.
        return;
    }
    let global = "[global]\ntokens = [{ limit = 50000, period = \"1d\" }]\n";
    let mut h = Harness::start(backend, &format!("{CONFIG}{global}")).await;
    let dir = crate::operations::temp_dir("limit-changes");
    let doc = |name: &str, text: &str| crate::operations::document(&dir, name, text);
    spend(&mut h, "acme", "free", 1500, 500).await;

    // A live `tiers set` that raises the tenant limit.
    let raised = doc(
        "free.toml",
        "max_context_tokens = 100000\ndefault_max_output_tokens = 100\n\
         tenant = { tokens = [{ limit = 8000, period = \"1d\" }] }\n",
    );
    h.ctl(&["tiers", "set", "free", &raised]).await.unwrap();
    until_limit(&mut h, "acme", "free", Level::Tenant, 8000).await;
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        6000,
        8000,
        "tiers set raised the limit",
    );
    // A reservation in flight, then an override that lowers the limit below
    // the use: what the settle returns is counted against the use, so
    // nothing is forgiven when the limit comes back.
    let r = h
        .client
        .check_and_reserve(reserve("acme", "", "free", 1000, 100))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:#?}");
    let lower = doc(
        "acme.toml",
        "tenant = { tokens = [{ limit = 1500, period = \"1d\" }] }\n",
    );
    h.ctl(&["overrides", "set", "--tenant", "acme", &lower])
        .await
        .unwrap();
    until_limit(&mut h, "acme", "free", Level::Tenant, 1500).await;
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        -1600,
        1500,
        "an override lowered it below the use (2,000 used, 1,100 in flight)",
    );
    h.client
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id,
            prompt_tokens: 200,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        -700,
        1500,
        "the commit settled 200 of the 1,100 reserved: 2,200 used",
    );
    h.ctl(&["overrides", "delete", "--tenant", "acme"])
        .await
        .unwrap();
    until_limit(&mut h, "acme", "free", Level::Tenant, 8000).await;
    assert_left(
        left(&mut h, "acme", "free", Level::Tenant).await,
        5800,
        8000,
        "the limit back: 2,200 used, nothing forgiven",
    );

    // The global level: 2,200 used of 50,000 (the share of a cluster replica
    // holds some of it leased, and gives it back as its chunks change).
    let raised = doc(
        "global.toml",
        "tokens = [{ limit = 90000, period = \"1d\" }]\n",
    );
    h.ctl(&["global", "set", &raised]).await.unwrap();
    until_limit(&mut h, "other", "pro", Level::Global, 90_000).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = left(&mut h, "other", "pro", Level::Global).await;
        if got.0 >= 87_800 {
            assert_left(got, 87_800, 90_000, "global set raised the account");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the global level kept its old room: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_dir_all(dir);
    h.stop().await;
}
