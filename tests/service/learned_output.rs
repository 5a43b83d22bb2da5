//! The learned output reservation end to end, against a real Redis and two
//! replicas of the real binary: the completions one replica commits teach
//! the other what to hold for the tier (a quantile of them, not the whole
//! `max_output_tokens`), GetEstimator shows it, and a level without
//! `output_reservation = "learned"` still holds the whole grant.

use crate::support;

use ctxbudget::pb;
use pb::budget_service_client::BudgetServiceClient;
use support::RedisServer;
use support::process::Service;
use tonic::transport::Channel;

const CONFIG: &str = r#"
[store]
timeout_ms = 5000

[estimator]
groups = { "claude-*" = "claude" }
output_min_samples = 20

[global]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 1000000, period = "1d" }], output_reservation = "learned", output_overrun = 1.0 }

[tiers.plain]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 1000000, period = "1m" }] }
"#;

const MODEL: &str = "claude-sonnet-4";

async fn reserve(c: &mut BudgetServiceClient<Channel>, tier: &str) -> pb::CheckAndReserveResponse {
    let r = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            tenant_id: "acme".into(),
            tier: tier.into(),
            model: MODEL.into(),
            prompt_tokens: Some(100),
            max_output_tokens: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");
    assert_eq!(
        r.granted_max_output_tokens, 1000,
        "the caller may still send its max"
    );
    r
}

async fn commit(
    c: &mut BudgetServiceClient<Channel>,
    r: &pb::CheckAndReserveResponse,
    completion: u64,
) {
    let out = c
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: 100,
            completion_tokens: completion,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.outcome(), pb::Outcome::Applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_learns_of_a_tiers_completions_the_other_holds() {
    let redis = RedisServer::start();
    let a = Service::start("teacher", CONFIG, Some(&redis.url()));
    let b = Service::start("holder", CONFIG, Some(&redis.url()));
    let (mut ca, mut cb) = (
        support::connect(a.addr).await,
        support::connect(b.addr).await,
    );
    // B reserves once before A teaches: too few completions, the whole max.
    let before = reserve(&mut cb, "t").await;
    assert_eq!(
        (before.reserved_output_tokens, before.reserved_tokens),
        (1000, 1100)
    );
    // 25 completions of 100 to 196 tokens: the 0.95 quantile is 192.
    for i in 0..25 {
        let r = reserve(&mut ca, "t").await;
        commit(&mut ca, &r, 100 + 4 * i).await;
    }
    commit(&mut cb, &before, 150).await;
    // B refreshes every pair it uses twice a second; 26 completions now
    // (100..196 and 150): the 0.95 quantile is still 192.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let after = reserve(&mut cb, "t").await;
    assert_eq!(
        (after.reserved_output_tokens, after.reserved_tokens),
        (192, 292),
        "{after:?}"
    );
    // The tenant's tokens show what is held: 292, not 1100 (less what the
    // day's rate refilled meanwhile: 11.6 tokens a second).
    let tokens = after
        .limits
        .iter()
        .find(|l| l.dimension() == pb::Dimension::Tokens)
        .expect("the tenant's tokens");
    let used: i64 = 100 * 26 + (100..=196).step_by(4).sum::<i64>() + 150 + 292;
    let taken = 1_000_000 - tokens.remaining;
    assert!(
        (used - 200..=used).contains(&taken),
        "{taken} of {used}: {tokens:?}"
    );
    // A tier whose levels hold the grant learns nothing and holds it all.
    let plain = reserve(&mut cb, "plain").await;
    assert_eq!(plain.reserved_output_tokens, 1000);

    let e = cb
        .get_estimator(pb::GetEstimatorRequest {
            model: MODEL.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let key = &e.keys[0];
    assert_eq!(key.key, "claude");
    assert_eq!(
        key.learned_outputs,
        vec![pb::LearnedOutput {
            tier: "t".into(),
            samples: 26,
            tokens: 192,
        }],
        "{key:?}"
    );
}
