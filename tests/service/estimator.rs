//! The adaptive estimator end to end, against a real Redis and the real
//! binary: estimator keys (Redis lists, metric labels, the multiplier cache)
//! stay bounded by the configuration whatever model names callers send, and a
//! replica's first decision for a key uses what the other replicas learned.

use crate::support;

use ctxbudget::config::FileConfig;
use ctxbudget::pb;
use ctxbudget::store::keys::{DEFAULT_PREFIX, Keys};
use pb::budget_service_client::BudgetServiceClient;
use redis::Commands;
use std::collections::BTreeSet;
use std::time::Duration;
use support::process::Service;
use support::{Harness, RedisServer, settings};
use tonic::transport::Channel;

const CONFIG: &str = r#"
[store]
timeout_ms = 5000

[estimator]
fast_path = ["gemini-*"]
groups = { "claude-*" = "claude" }
window = 50
min_samples = 10

[global]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
user = { tokens = [{ limit = 1000000000, period = "1d" }] }
"#;

const PROMPT: &str = "Summarise this support thread in two lines, then draft a reply.";

/// A counted prompt for `model`.
fn request(model: &str, user: &str) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        tenant_id: "acme".into(),
        user_id: user.into(),
        tier: "t".into(),
        model: model.into(),
        prompt: PROMPT.into(),
        max_output_tokens: 10,
        ..Default::default()
    }
}

/// Reserves with `model`'s name and commits `ratio` × the estimate.
async fn reserve_commit(
    c: &mut BudgetServiceClient<Channel>,
    model: &str,
    user: &str,
    ratio: f64,
) -> pb::CheckAndReserveResponse {
    let r = c.check_and_reserve(request(model, user)).await.unwrap();
    let r = r.into_inner();
    assert!(r.allowed, "{r:?}");
    let actual = (r.estimated_prompt_tokens as f64 * ratio).round() as u64;
    let c = c
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: actual,
            completion_tokens: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.outcome(), pb::Outcome::Applied);
    r
}

/// The `key` label values of metric `name` on a scrape.
fn key_labels(metrics: &str, name: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split("key=\"").nth(1)?.split('"').next())
        .map(String::from)
        .collect()
}

/// Every key GetEstimator lists (an empty model lists the whole cache).
async fn cached_keys(c: &mut BudgetServiceClient<Channel>) -> BTreeSet<String> {
    let all = pb::GetEstimatorRequest {
        model: String::new(),
    };
    let e = c.get_estimator(all).await.unwrap().into_inner();
    e.keys.into_iter().map(|k| k.key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimator_keys_stay_bounded_whatever_model_names_callers_send() {
    let redis = RedisServer::start();
    let svc = Service::start("keys", CONFIG, Some(&redis.url()));
    let client = support::connect(svc.addr).await;
    // Random names in every family: none named twice.
    let families = ["", "gpt-4o-", "GPT-4-", "openai/o3-", "claude-", "gemini-"];
    const PER_TASK: usize = 334;
    let tasks: Vec<_> = (0..6)
        .map(|task| {
            let mut c = client.clone();
            tokio::spawn(async move {
                for i in 0..PER_TASK {
                    let family = families[(task + i) % families.len()];
                    let model = format!("{family}{:016x}", rand::random::<u64>());
                    reserve_commit(&mut c, &model, &format!("u{task}"), 1.2).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // The rules give exactly these keys: a group, a fast-path pattern, three
    // rows of the tokenizer table, and the encoding every other name shares.
    let expected: BTreeSet<String> = ["claude", "gemini-*", "gpt-4o", "gpt-4", "o3", "o200k_base"]
        .map(String::from)
        .into();
    let rules = FileConfig::parse(CONFIG, "test")
        .unwrap()
        .estimator
        .unwrap()
        .model_rules()
        .unwrap();
    let bound = rules.keys().len();
    assert!(expected.iter().all(|k| rules.keys().contains(&k.as_str())));
    assert!(bound <= 20, "the bound: {:?}", rules.keys());

    let keys = Keys::new(DEFAULT_PREFIX).unwrap();
    let stored: BTreeSet<String> = redis.conn().keys(format!("{DEFAULT_PREFIX}e:*")).unwrap();
    assert!(
        stored.len() <= bound,
        "{} sample lists in Redis",
        stored.len()
    );
    let wanted: BTreeSet<String> = expected.iter().map(|k| keys.estimator(k)).collect();
    assert_eq!(stored, wanted, "one list per key, not per model name");

    // The multiplier gauge is published by the refresh, twice a second.
    let gauge = "ctxbudget_estimator_multiplier";
    svc.wait_metric(
        gauge,
        &[("key", "claude")],
        Duration::from_secs(5),
        "gauge",
        |v| v >= 1.0,
    );
    let metrics = svc.scrape().expect("/metrics answers");
    // Every key the rules can give is registered at start, and no other.
    let possible: BTreeSet<String> = rules.keys().into_iter().map(String::from).collect();
    let ratio = key_labels(&metrics, "ctxbudget_estimation_ratio");
    assert!(ratio.len() <= bound, "{} ratio key labels", ratio.len());
    assert!(
        expected.is_subset(&ratio) && ratio.is_subset(&possible),
        "{ratio:?}"
    );
    let multiplier = key_labels(&metrics, gauge);
    assert!(multiplier.is_subset(&possible), "{multiplier:?}");
    let cached = cached_keys(&mut client.clone()).await;
    assert!(cached.len() <= bound, "{} keys in the cache", cached.len());
    assert_eq!(cached, expected, "the multiplier cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_decides_with_what_the_others_learned() {
    let redis = RedisServer::start();
    let a = Service::start("learner", CONFIG, Some(&redis.url()));
    let mut ca = support::connect(a.addr).await;
    // This model needs 36% more tokens than the service counts.
    for _ in 0..20 {
        reserve_commit(&mut ca, "deepseek-chat", "alice", 1.36).await;
    }
    let learned = ca
        .get_estimator(pb::GetEstimatorRequest {
            model: "deepseek-chat".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .keys[0]
        .multiplier;
    assert!(learned > 1.3, "A learned {learned}");

    let b = Service::start("newcomer", CONFIG, Some(&redis.url()));
    let mut cb = support::connect(b.addr).await;
    let first = cb
        .check_and_reserve(request("deepseek-chat", "bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        first.estimator_multiplier, learned,
        "B's very first decision uses the shared samples, not the initial 1.15"
    );
    // B read them through the store's breaker, which times every call.
    let read = b.metric(
        "ctxbudget_store_duration_seconds_count",
        &[("op", "estimator")],
    );
    assert!(read.is_some_and(|n| n >= 1.0), "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_store_a_new_key_starts_at_the_initial_multiplier() {
    let mut redis = RedisServer::start();
    let s = settings(CONFIG, Some(redis.url()));
    let mut h = Harness::start_with(s, None).await;
    redis.kill();
    let r = h
        .client
        .check_and_reserve(request("gpt-4o", "alice"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed && r.degraded, "{r:?}");
    assert_eq!(r.estimator_multiplier, 1.15);
}
