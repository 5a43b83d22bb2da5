//! Threshold alerts end to end, with a real local HTTP receiver: 200
//! concurrent callers cross 80%, 95% and 100% of a tenant's daily tokens and
//! 50% of its hourly requests, and each crossing reaches the receiver exactly
//! once, signed — on one replica in memory and across two sharing Redis; a
//! receiver that is down for 10 s then receives every alert; a replica killed
//! after the crossing leaves its alerts to another; `ctxbudget alerts list`
//! shows them and `alerts test` sends a signed test event.

use crate::operations::{ctl_binary, ctl_binary_at};
use crate::support;

use ctxbudget::pb;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::cluster::RedisCluster;
use support::receiver::{Post, Receiver};
use support::{Backend, Harness, RedisServer, reserve, settings};

const SECRET: &str = "alert-signing-secret";

/// A tenant whose 2,000 tokens a (UTC) day warn at 80, 95 and 100%, and
/// whose 390 requests an hour warn at half (a rolling limit refills while
/// the calls run: 200 of them pass 195 all the same); the receiver at `url`.
fn config(url: &str) -> String {
    format!(
        r#"
[alerts]
webhook_url = "{url}"
secret = "{SECRET}"
timeout_ms = 500
max_backoff_ms = 1000

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 1
tenant = {{ tokens = [{{ limit = 2000, window = "day", alert_at = [0.8, 0.95, 1.0] }}], requests = [{{ limit = 390, period = "1h", alert_at = [0.5] }}] }}
"#
    )
}

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

/// 200 reservations of 10 tokens at once, spread over `clients`: 2,000
/// tokens (100% of the day's) and 200 requests (over half the hour's).
async fn two_hundred_callers(clients: &[Client]) {
    let calls = (0..200).map(|i| {
        let mut c = clients[i % clients.len()].clone();
        tokio::spawn(async move {
            let r = c
                .check_and_reserve(reserve("acme", &format!("u{i}"), "t", 9, 1))
                .await
                .unwrap()
                .into_inner();
            assert!(r.allowed, "{r:?}");
        })
    });
    for call in calls.collect::<Vec<_>>() {
        call.await.unwrap();
    }
}

/// The four alerts, each exactly once, signed with the secret.
fn exactly_the_four(posts: &[Post]) {
    let mut by_id: BTreeMap<&str, usize> = BTreeMap::new();
    for p in posts {
        *by_id.entry(&p.event_id).or_default() += 1;
        let want = ctxbudget::alerts::webhook::signature(SECRET, &p.body);
        assert_eq!(p.signature.as_deref(), Some(want.as_str()), "signed");
        assert_eq!(p.json()["event_id"], p.event_id.as_str());
    }
    assert!(by_id.values().all(|&n| n == 1), "no repeats: {by_id:?}");
    let mut seen: Vec<(String, f64)> = posts
        .iter()
        .map(|p| {
            let e = p.json();
            assert_eq!(
                (e["tenant"].as_str(), e["level"].as_str()),
                (Some("acme"), Some("tenant"))
            );
            assert_eq!(e["type"], "threshold_crossed");
            let (limit, threshold) = (&e["limit"]["limit"], e["threshold"].as_f64().unwrap());
            let usage = e["usage"].as_f64().unwrap();
            assert!(usage >= threshold * limit.as_f64().unwrap(), "{e}");
            match e["limit"]["dimension"].as_str().unwrap() {
                "tokens" => {
                    assert_eq!(e["limit"]["window"], "day");
                    assert!(e["window_start"].is_string(), "a calendar window's start");
                }
                other => {
                    let period = e["limit"]["period_secs"].as_u64();
                    assert_eq!((other, period), ("requests", Some(3600)));
                    assert!(e["window_start"].is_null());
                }
            }
            (
                e["limit"]["dimension"].as_str().unwrap().to_owned(),
                threshold,
            )
        })
        .collect();
    seen.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let want = [
        ("requests", 0.5),
        ("tokens", 0.8),
        ("tokens", 0.95),
        ("tokens", 1.0),
    ];
    let want: Vec<(String, f64)> = want.iter().map(|(d, t)| (d.to_string(), *t)).collect();
    assert_eq!(
        seen, want,
        "80, 95 and 100% of the tokens, 50% of the requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_crossing_reaches_the_receiver_once_in_memory() {
    let receiver = Receiver::start().await;
    let h = Harness::start_with(settings(&config(&receiver.url), None), None).await;
    two_hundred_callers(std::slice::from_ref(&h.client)).await;
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(20)).await);
    assert_eq!(
        receiver.posts().len(),
        4,
        "nothing refused, nothing sent twice"
    );
    h.stop().await;
}

/// Two replicas over one Redis.
async fn two_replicas(url: &str) -> (RedisServer, Harness, Harness) {
    let redis = RedisServer::start();
    let a = Harness::start_with(settings(&config(url), Some(redis.url())), None).await;
    let b = Harness::start_with(settings(&config(url), Some(redis.url())), None).await;
    (redis, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_each_crossing_once_and_alerts_list_shows_them() {
    let receiver = Receiver::start().await;
    let (redis, a, b) = two_replicas(&receiver.url).await;
    two_hundred_callers(&[a.client.clone(), b.client.clone()]).await;
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(20)).await);
    assert_eq!(
        receiver.posts().len(),
        4,
        "no replica sent what the other did"
    );

    let (ok, out, err) = ctl_binary(&redis, &["alerts", "list", "--json"]);
    assert!(ok, "{out}{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["queued"].as_array().unwrap().len(), 0, "{listed}");
    let recent = listed["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 4, "{listed}");
    assert!(
        recent.iter().all(|r| r["status"] == "delivered"),
        "{listed}"
    );
    let (ok, table, err) = ctl_binary(&redis, &["alerts", "list"]);
    assert!(
        ok && table.contains("delivered") && table.contains("2000 tokens / day"),
        "{table}{err}"
    );

    // A test event, signed as the service signs.
    let (ok, out, err) = ctl_binary(
        &redis,
        &[
            "alerts",
            "test",
            "--webhook-url",
            &receiver.url,
            "--secret",
            SECRET,
        ],
    );
    assert!(ok && out.contains("delivered test event"), "{out}{err}");
    let test = receiver.posts().pop().unwrap();
    assert_eq!(test.json()["type"], "test");
    let want = ctxbudget::alerts::webhook::signature(SECRET, &test.body);
    assert_eq!(test.signature.as_deref(), Some(want.as_str()));
    receiver.set_down(true);
    let (ok, _, err) = ctl_binary(&redis, &["alerts", "test", "--webhook-url", &receiver.url]);
    assert!(
        !ok && err.contains("HTTP 503"),
        "a refused test event fails: {err}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_ten_seconds_then_receives_every_alert() {
    let receiver = Receiver::start().await;
    receiver.set_down(true);
    let down_since = Instant::now();
    let (_redis, a, b) = two_replicas(&receiver.url).await;
    two_hundred_callers(&[a.client.clone(), b.client.clone()]).await;
    receiver.await_refused(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(down_since.elapsed())).await;
    receiver.set_down(false);
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(30)).await);
    let refused = receiver.posts().iter().filter(|p| !p.accepted).count();
    assert!(
        refused >= 4,
        "every alert was tried while the receiver was down: {refused}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_after_the_crossing_leaves_its_alerts_to_another() {
    let receiver = Receiver::start().await;
    receiver.set_down(true);
    let redis = RedisServer::start();
    let a = Harness::start_with(settings(&config(&receiver.url), Some(redis.url())), None).await;
    two_hundred_callers(std::slice::from_ref(&a.client)).await;
    // The crossing replica has claimed its alerts and failed to send them.
    receiver.await_refused(Duration::from_secs(10)).await;
    a.stop().await;
    let tried_by_a = receiver.posts().len();
    let b = Harness::start_with(settings(&config(&receiver.url), Some(redis.url())), None).await;
    receiver.set_down(false);
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(30)).await);
    assert!(tried_by_a > 0);
    b.stop().await;
}

/// Two replicas over one local Redis Cluster, where the tenant's queue and
/// the index of queues are in different slots (`crates/store/lua/alert_index.lua`): the
/// receiver down, the replica that crossed killed, the other delivers each
/// alert once; `alerts list` reads the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_killed_replicas_alerts_are_delivered_once_by_another() {
    let receiver = Receiver::start().await;
    receiver.set_down(true);
    let mut a = Harness::start(Backend::Cluster, &config(&receiver.url)).await;
    // The cluster outlives the replica that started it.
    let cluster: RedisCluster = a.cluster.take().unwrap();
    let nodes = cluster.urls();
    let on_cluster = |toml: &str| {
        let mut s = settings(toml, None);
        s.cluster_nodes = nodes.clone();
        s
    };
    let b = Harness::start_with(on_cluster(&config(&receiver.url)), None).await;
    two_hundred_callers(&[a.client.clone(), b.client.clone()]).await;
    receiver.await_refused(Duration::from_secs(10)).await;
    let store = vec!["--redis-cluster-nodes".to_string(), nodes.join(",")];
    a.stop().await;
    receiver.set_down(false);
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(30)).await);
    let (ok, out, err) = ctl_binary_at(&store, &["alerts", "list", "--json"]);
    assert!(ok, "{out}{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["queued"].as_array().unwrap().len(), 0, "{listed}");
    assert_eq!(listed["recent"].as_array().unwrap().len(), 4, "{listed}");
    b.stop().await;
    drop(cluster);
}

/// Envoy's rate limit service charges without a reservation: its requests
/// cross thresholds too (`crates/store/lua/charge.lua`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_requests_cross_thresholds_too() {
    use crate::envoy::{ask, descriptor, envoy_client, request};
    let receiver = Receiver::start().await;
    let toml = format!(
        r#"
[alerts]
webhook_url = "{}"
secret = "{SECRET}"

[envoy]
default_tier = "t"

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 1
tenant = {{ requests = [{{ limit = 10, window = "day", alert_at = [0.5] }}] }}
"#,
        receiver.url
    );
    let redis = RedisServer::start();
    let h = Harness::start_with(settings(&toml, Some(redis.url())), None).await;
    let mut envoy = envoy_client(&h).await;
    for _ in 0..6 {
        let tenant = descriptor(&[("tenant", "acme")], Some(1));
        ask(&mut envoy, request("llm", vec![tenant])).await;
    }
    let posts = receiver.await_accepted(1, Duration::from_secs(20)).await;
    assert_eq!(posts.len(), 1, "50% crossed once: {posts:?}");
    let e = posts[0].json();
    assert_eq!(
        (e["tenant"].as_str(), e["threshold"].as_f64()),
        (Some("acme"), Some(0.5))
    );
    assert_eq!(e["limit"]["dimension"], "requests");
    h.stop().await;
}

/// On a cluster, a replica that died between a crossing and indexing its
/// queue leaves the queue out of the index: the next replica to start finds
/// it (one SCAN) and delivers its alerts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_queue_left_out_of_the_index_is_found_at_start() {
    let receiver = Receiver::start().await;
    receiver.set_down(true);
    let mut a = Harness::start(Backend::Cluster, &config(&receiver.url)).await;
    let cluster: RedisCluster = a.cluster.take().unwrap();
    let nodes = cluster.urls();
    two_hundred_callers(std::slice::from_ref(&a.client)).await;
    a.stop().await;
    // As if the replica had died before indexing: no index at all.
    let port = nodes[0].rsplit(':').next().unwrap().trim_end_matches('/');
    let deleted = std::process::Command::new("redis-cli")
        .args(["-c", "-p", port, "DEL", "ctxb:{a}", "ctxb:{a}:seen"])
        .output()
        .unwrap();
    assert!(deleted.status.success(), "{deleted:?}");
    receiver.set_down(false);
    let mut s = settings(&config(&receiver.url), None);
    s.cluster_nodes = nodes.clone();
    let b = Harness::start_with(s, None).await;
    exactly_the_four(&receiver.await_accepted(4, Duration::from_secs(30)).await);
    b.stop().await;
    drop(cluster);
}
