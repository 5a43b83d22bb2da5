//! Images per minute, end to end on every store: `images` limits at a level
//! and per model group take what a CheckAndReserve says the call may
//! generate (`images`), a denial names the image limit and when to retry,
//! Commit moves the limits by the images generated less those reserved and
//! charges each at the group's `image` price, and the usage ledger reports
//! them.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level};
use serde_json::Value;
use support::{Backend, Harness};

on_every_store!(
    images_are_reserved_denied_and_settled_by_the_count,
    a_model_groups_image_limit_and_price_apply_to_its_models,
);

const CONFIG: &str = r#"
[models.dall-e]
match = ["dall-e-*"]

[prices.dall-e]
input = 0.0
output = 0.0
image = 0.04

[global]
images = [{ limit = 1000, period = "1m" }]

[tiers.t]
max_context_tokens = 10000
default_max_output_tokens = 10
tenant = { images = [{ limit = 50, period = "1m" }], spend = [{ limit_usd = 100, window = "month" }] }
user = { images = [{ limit = 10, period = "1m" }] }

[tiers.t.models.dall-e]
user = { images = [{ limit = 6, period = "1h" }] }
"#;

/// A call of `user` to `model` that may generate `images` images.
fn ask(user: &str, model: &str, images: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        model: model.into(),
        images,
        ..support::reserve("acme", user, "t", 20, 10)
    }
}

async fn status(h: &mut Harness, user: &str, model: &str) -> Vec<pb::LimitStatus> {
    h.client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: user.into(),
            tier: "t".into(),
            model: model.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .limits
}

/// The images `user`'s per-minute limit has left (the refill of 10 a minute
/// between calls adds a fraction at most).
async fn user_images_left(h: &mut Harness, user: &str) -> i64 {
    let limits = status(h, user, "gpt-4o").await;
    support::limit(&limits, Level::User, Dimension::Images, 60).remaining
}

/// What the tenant's monthly spend window has taken, µ$ (a window does not
/// refill within).
fn spent(limits: &[pb::LimitStatus]) -> i64 {
    let s = limits
        .iter()
        .find(|l| l.level() == Level::Tenant && l.dimension() == Dimension::Spend)
        .unwrap_or_else(|| panic!("no spend limit in {limits:#?}"));
    s.limit as i64 - s.remaining
}

async fn commit(h: &mut Harness, id: &str, images: u64) -> pb::CommitResponse {
    h.client
        .commit(pb::CommitRequest {
            reservation_id: id.into(),
            prompt_tokens: 20,
            completion_tokens: 5,
            images,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn images_are_reserved_denied_and_settled_by_the_count(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    assert_eq!(user_images_left(&mut h, "alice").await, 10);
    let first = h
        .client
        .check_and_reserve(ask("alice", "gpt-4o", 4))
        .await
        .unwrap()
        .into_inner();
    assert!(first.allowed, "{first:?}");
    assert_eq!(user_images_left(&mut h, "alice").await, 6, "4 reserved");
    // 7 more cannot fit the 6 left: the user's image limit denies, and says
    // when one more image's worth has refilled (10 a minute: 6 s each).
    let denied = h
        .client
        .check_and_reserve(ask("alice", "gpt-4o", 7))
        .await
        .unwrap()
        .into_inner();
    assert!(!denied.allowed);
    assert_eq!(denied.reason(), pb::Reason::ImagesExceeded);
    assert_eq!(
        (denied.limiting_level(), denied.limiting_dimension()),
        (Level::User, Dimension::Images)
    );
    assert!(
        (1..=6_000).contains(&denied.retry_after_ms),
        "{}",
        denied.retry_after_ms
    );
    assert!(
        denied.detail.contains("image"),
        "the denial names the image limit: {}",
        denied.detail
    );
    assert_eq!(
        user_images_left(&mut h, "alice").await,
        6,
        "a denial takes nothing"
    );
    // Two were generated of the 4 reserved: 2 come back.
    let c = commit(&mut h, &first.reservation_id, 2).await;
    assert_eq!(c.outcome(), pb::Outcome::Applied);
    assert_eq!(user_images_left(&mut h, "alice").await, 8);
    // A refund gives every image back; a call that makes none takes none.
    let second = h
        .client
        .check_and_reserve(ask("alice", "gpt-4o", 5))
        .await
        .unwrap()
        .into_inner();
    assert!(second.allowed);
    assert_eq!(user_images_left(&mut h, "alice").await, 3);
    h.client
        .refund(pb::RefundRequest {
            reservation_id: second.reservation_id,
        })
        .await
        .unwrap();
    assert_eq!(user_images_left(&mut h, "alice").await, 8);
    let text = h
        .client
        .check_and_reserve(ask("alice", "gpt-4o", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(text.allowed);
    assert_eq!(user_images_left(&mut h, "alice").await, 8);
    // Bad input is refused whole.
    let err = h
        .client
        .check_and_reserve(ask("alice", "gpt-4o", 1 << 41))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("images"), "{}", err.message());
    h.stop().await;
}

async fn a_model_groups_image_limit_and_price_apply_to_its_models(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    // The group's 6 an hour bound bob's calls to dall-e models; the
    // reservation holds the images' worst-case spend (4 × $0.04).
    let r = h
        .client
        .check_and_reserve(ask("bob", "dall-e-3", 4))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");
    let limits = status(&mut h, "bob", "dall-e-3").await;
    let group = limits
        .iter()
        .find(|l| {
            l.level() == Level::User
                && l.dimension() == Dimension::Images
                && l.model_group == "dall-e"
        })
        .unwrap_or_else(|| panic!("no dall-e image limit in {limits:#?}"));
    assert_eq!((group.limit, group.remaining), (6, 2));
    let spend = spent(&limits);
    assert_eq!(spend, 160_000, "4 images at 40,000 µ$");
    let denied = h
        .client
        .check_and_reserve(ask("bob", "dall-e-3", 3))
        .await
        .unwrap()
        .into_inner();
    assert!(!denied.allowed);
    assert_eq!(denied.reason(), pb::Reason::ImagesExceeded);
    assert_eq!(
        (
            denied.limiting_model_group.as_str(),
            denied.limiting_period_seconds
        ),
        ("dall-e", 3600)
    );
    // Three were generated: each is charged at the group's image price.
    let c = commit(&mut h, &r.reservation_id, 3).await;
    assert_eq!(c.cost_micros, 120_000);
    let limits = status(&mut h, "bob", "dall-e-3").await;
    assert_eq!(spent(&limits), 120_000, "what was charged");
    // The ledger reports them (a shared store: the CLI reads it).
    if let Some(store) = h.store_args() {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let day = chrono::DateTime::from_timestamp(secs as i64, 0)
            .unwrap()
            .date_naive();
        let (from, to) = (
            day.pred_opt().unwrap().to_string(),
            day.succ_opt().unwrap().succ_opt().unwrap().to_string(),
        );
        let args = [
            "usage", "--tenant", "acme", "--from", &from, "--to", &to, "--json",
        ];
        let (ok, out, err) = crate::operations::ctl_binary_at(&store, &args);
        assert!(ok, "{out}{err}");
        let report: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["total"]["images"], 3, "{report:#}");
        assert_eq!(report["total"]["cost_micros"], 120_000, "{report:#}");
    }
    h.stop().await;
}
