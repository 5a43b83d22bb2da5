//! The content-aware correction end to end, against a real Redis and two
//! replicas of the real binary: what one replica's Commits teach (Thai costs
//! the model 2.5 times what the service counts, English what it counts),
//! the other applies — tight for English where one multiplier would have to
//! cover Thai — and GetEstimator and the metrics show it.

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
correction = "content"
content_min_samples = 20

[global]

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
user = { tokens = [{ limit = 1000000000, period = "1d" }] }
"#;

const MODEL: &str = "claude-sonnet-4";

const ENGLISH: [&str; 4] = [
    "Summarise this support thread in two lines, then draft a reply.",
    "The invoice for October was sent twice; please refund the duplicate charge and confirm by email.",
    "Write a short poem about the sea.",
    "Our deployment failed after the upgrade because the health check timed out before the cache was warm, so the rollout stopped halfway.",
];

const THAI: [&str; 4] = [
    "สวัสดีครับ ช่วยสรุปข้อความนี้ให้หน่อย",
    "ใบแจ้งหนี้เดือนตุลาคมถูกส่งมาสองครั้ง กรุณาคืนเงินส่วนที่ซ้ำและยืนยันทางอีเมล",
    "เขียนกลอนสั้นๆ เกี่ยวกับทะเล",
    "การติดตั้งล้มเหลวหลังจากอัปเกรดเพราะการตรวจสอบสุขภาพหมดเวลาก่อนที่แคชจะพร้อม การเปิดตัวจึงหยุดกลางทาง",
];

async fn reserve(
    c: &mut BudgetServiceClient<Channel>,
    prompt: &str,
) -> pb::CheckAndReserveResponse {
    let r = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
            tier: "t".into(),
            model: MODEL.into(),
            prompt: prompt.into(),
            max_output_tokens: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");
    r
}

async fn commit(
    c: &mut BudgetServiceClient<Channel>,
    r: &pb::CheckAndReserveResponse,
    prompt: u64,
) {
    let out = c
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: prompt,
            completion_tokens: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.outcome(), pb::Outcome::Applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_learns_of_each_group_the_other_applies() {
    let redis = RedisServer::start();
    let a = Service::start("teacher", CONFIG, Some(&redis.url()));
    let b = Service::start("applier", CONFIG, Some(&redis.url()));
    let (mut ca, mut cb) = (
        support::connect(a.addr).await,
        support::connect(b.addr).await,
    );
    // B decides once before A teaches: it caches the key and refreshes it.
    let before = reserve(&mut cb, ENGLISH[0]).await;
    assert_eq!(before.estimator_multiplier, 1.15, "the initial multiplier");
    for i in 0..48 {
        let (prompt, cost) = match i % 2 {
            0 => (ENGLISH[i / 2 % 4], 1.0),
            _ => (THAI[i / 2 % 4], 2.5),
        };
        let r = reserve(&mut ca, prompt).await;
        commit(
            &mut ca,
            &r,
            (r.estimated_prompt_tokens as f64 * cost).round() as u64 + 4,
        )
        .await;
    }
    // B refreshes every key it uses twice a second.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let e = cb
        .get_estimator(pb::GetEstimatorRequest {
            model: MODEL.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let key = &e.keys[0];
    assert_eq!(
        (key.key.as_str(), key.correction.as_str()),
        ("claude", "content")
    );
    assert!(key.multiplier > 2.2, "the scalar must cover Thai: {key:?}");
    let fit = key.content_fit.as_ref().expect("fitted on 48 samples");
    assert_eq!(fit.samples, 48);
    let cost = |group: &str| fit.costs.iter().find(|c| c.group == group).unwrap().cost;
    assert!((0.85..1.2).contains(&cost("latin")), "{fit:?}");
    assert!((2.2..2.8).contains(&cost("thai")), "{fit:?}");
    assert!(fit.bound >= 1.0 && fit.bound < 1.15, "{fit:?}");

    let english = reserve(&mut cb, ENGLISH[3]).await;
    assert!(
        english.estimator_multiplier < 1.3,
        "tight for English on the replica that only read the samples: {english:?}"
    );
    let thai = reserve(&mut cb, THAI[3]).await;
    assert!(thai.estimator_multiplier > 2.3, "{thai:?}");
    let actual = (thai.estimated_prompt_tokens as f64 * 2.5).round() + 4.0;
    assert!(
        thai.reserved_tokens - 10 >= actual as u64,
        "the Thai prompt's reservation covers what the model will count"
    );

    // A counted the Commits that its early, scalar reservations fell short of.
    let under = a.metric(
        "ctxbudget_estimator_under_reserved_total",
        &[("key", "claude")],
    );
    assert!(
        under.is_some_and(|n| (1.0..=48.0).contains(&n)),
        "{under:?}"
    );
}
