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

/// Waits until `c`'s replica holds `tokens` for tier `t`, learned from
/// `samples` completions (it refreshes what it learned twice a second; a
/// busy machine may take longer).
async fn learned(c: &mut BudgetServiceClient<Channel>, tokens: u64, samples: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let e = c
            .get_estimator(pb::GetEstimatorRequest {
                model: MODEL.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let found = e
            .keys
            .first()
            .and_then(|k| k.learned_outputs.first().cloned());
        match found {
            Some(l) if (l.tokens, l.samples) == (tokens, samples) => return,
            other if std::time::Instant::now() > deadline => panic!("still {other:?}"),
            _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
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
    // B refreshes every pair it uses; 26 completions now (100..196 and
    // 150): the 0.95 quantile is still 192.
    learned(&mut cb, 192, 26).await;
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

/// A tenant of 100,000 tokens a day whose calls learned to write 100 of
/// their 1,000 output tokens: `calls` arrive at once over two replicas and
/// every one writes all 1,000. Returns (admitted, tokens used beyond the
/// limit).
async fn overrun_by(calls: usize) -> (usize, i64) {
    const OVERRUN: &str = r#"
[store]
timeout_ms = 5000

[estimator]
output_min_samples = 20

[global]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { tokens = [{ limit = 100000, period = "1d" }], output_reservation = "learned", output_overrun = 0.5 }
"#;
    let redis = RedisServer::start();
    let a = Service::start("a", OVERRUN, Some(&redis.url()));
    let b = Service::start("b", OVERRUN, Some(&redis.url()));
    let mut ca = support::connect(a.addr).await;
    let cb = support::connect(b.addr).await;
    let warm = reserve(&mut ca, "t").await;
    commit(&mut ca, &warm, 100).await;
    for _ in 0..19 {
        let r = reserve(&mut ca, "t").await;
        commit(&mut ca, &r, 100).await;
    }
    // A has refreshed what it learned; B, never asked yet, reads it first.
    learned(&mut ca, 100, 20).await;
    let ask = pb::CheckAndReserveRequest {
        tenant_id: "acme".into(),
        tier: "t".into(),
        model: MODEL.into(),
        prompt_tokens: Some(100),
        max_output_tokens: 1000,
        ..Default::default()
    };
    let burst = (0..calls).map(|i| {
        let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
        let ask = ask.clone();
        async move { c.check_and_reserve(ask).await.unwrap().into_inner() }
    });
    let replies = futures_util::future::join_all(burst).await;
    let admitted: Vec<_> = replies.iter().filter(|r| r.allowed).collect();
    let learned = admitted
        .iter()
        .filter(|r| r.reserved_output_tokens == 100)
        .count();
    assert!(learned > 0, "some calls hold the learned output");
    for r in &admitted {
        commit(&mut ca, r, 1000).await;
    }
    let used = 20 * 200 + admitted.len() as i64 * 1100;
    (admitted.len(), used - 100_000)
}

/// The worst case the docs promise: calls in flight that all write far past
/// the learned output overspend a level by at most its overrun credit
/// (`output_overrun` × the limit: 50,000 here) plus its refill meanwhile —
/// with 20 calls in flight not at all, with 200 by less than the credit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_overrunning_the_learned_output_overspend_at_most_the_credit() {
    let (admitted, over) = overrun_by(20).await;
    assert_eq!(
        (admitted, over <= 0),
        (20, true),
        "{admitted} admitted, {over} over"
    );
    let (admitted, over) = overrun_by(200).await;
    // 55 hold the learned 200 (a credit of 50,000 covers 55 × 900), the rest
    // the whole 1,100 while tokens last: 96,000 - 55 × 200 = 85,000, 77 of them.
    assert_eq!(admitted, 132, "{over} over");
    assert!((0..=50_000).contains(&over), "{over} tokens over the limit");
}
