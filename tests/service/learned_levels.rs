//! A level holds its own output (docs/estimation.md): the learned output
//! where `output_reservation = "learned"`, the grant where it is `"max"`,
//! nothing where it has no token or spend limit. So a `[global]` level left
//! on `"max"` with only a request limit does not make a learned tenant hold
//! the whole `max_output_tokens`, and one with a token limit holds the grant
//! there while the tenant still holds the learned output. On every store.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level};
use std::time::{Duration, Instant};
use support::{Backend, Harness};

on_every_store!(
    a_global_with_only_requests_leaves_the_learned_output_to_the_tenant,
    a_global_holding_the_grant_leaves_the_tenant_holding_the_learned_output,
);

/// A learned tenant under `global`: 150 completions of 200 to 398 tokens.
fn config(global: &str) -> String {
    format!(
        r#"
[estimator]
output_min_samples = 20

[global]
{global}

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = {{ tokens = [{{ limit = 100000, period = "10m" }}], output_reservation = "learned" }}
"#
    )
}

/// The model of [`support::reserve`].
const MODEL: &str = "gpt-4o";

/// A call of 100 prompt tokens asking for 2,000 output tokens, allowed.
async fn reserve(h: &mut Harness) -> pb::CheckAndReserveResponse {
    let ask = support::reserve("acme", "", "t", 100, 2000);
    let r = h.client.check_and_reserve(ask).await.unwrap().into_inner();
    assert!(r.allowed, "{r:?}");
    r
}

/// Teaches tier `t` 150 completions of 200..=398 tokens (its 0.95 quantile
/// is 388) and waits until this replica holds it.
async fn teach(h: &mut Harness) -> u64 {
    for i in 0..150u64 {
        let r = reserve(h).await;
        let out = h
            .client
            .commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: 100,
                completion_tokens: 200 + (i * 2) % 200,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(out.outcome(), pb::Outcome::Applied);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let e = h
            .client
            .get_estimator(pb::GetEstimatorRequest {
                model: MODEL.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let learned = e
            .keys
            .first()
            .and_then(|k| k.learned_outputs.first().cloned());
        match learned {
            Some(l) if l.samples == 150 && l.tokens > 0 => return l.tokens,
            other if Instant::now() > deadline => panic!("never learned: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// What the tenant's token bucket has left, as GetStatus reports it.
async fn tenant_tokens_left(h: &mut Harness) -> i64 {
    let s = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            tier: "t".into(),
            model: MODEL.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    support::limit(&s.limits, Level::Tenant, Dimension::Tokens, 600).remaining
}

/// Teaches the learned tenant under `global`, reserves once, and checks
/// what it reserved: the learned output, or with `global_holds_grant` the
/// global level's grant; the tenant's bucket takes the prompt and the
/// learned output either way.
async fn holds_after_teaching(backend: Backend, global: &str, global_holds_grant: bool) {
    let mut h = Harness::start(backend, &config(global)).await;
    let learned = teach(&mut h).await;
    assert!((300..=398).contains(&learned), "{learned}");
    let before = tenant_tokens_left(&mut h).await;
    let r = reserve(&mut h).await;
    assert_eq!(
        r.granted_max_output_tokens, 2000,
        "the caller may still send its max"
    );
    let taken = before - tenant_tokens_left(&mut h).await;
    let reserved = match global_holds_grant {
        true => 2000,
        false => learned,
    };
    assert_eq!(
        (r.reserved_output_tokens, r.reserved_tokens),
        (reserved, 100 + reserved),
        "the most any level holds"
    );
    // The refill between the two reads (100,000 per 10 min) is at most a
    // few tokens: the tenant took the prompt and the learned output.
    let held = 100 + learned as i64;
    assert!(
        (held - 20..=held).contains(&taken),
        "took {taken}, holds {held}"
    );
    h.stop().await;
}

async fn a_global_with_only_requests_leaves_the_learned_output_to_the_tenant(backend: Backend) {
    // A global level without a token limit holds no output.
    let global = r#"requests = [{ limit = 10000000, period = "1m" }]"#;
    holds_after_teaching(backend, global, false).await;
}

async fn a_global_holding_the_grant_leaves_the_tenant_holding_the_learned_output(backend: Backend) {
    let global = r#"requests = [{ limit = 10000000, period = "1m" }]
tokens = [{ limit = 100000000, period = "1m" }]"#;
    holds_after_teaching(backend, global, true).await;
}
