//! A stream cut short, settled with the text it delivered: Commit's
//! `completion_text` is counted with the reservation's tokenizer and charged
//! as the completion; the prompt the gateway sends then is only the prompt as
//! reserved, so the estimator learns nothing from it. Both counts at once are
//! refused and change nothing. On every store.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Outcome};
use support::{Backend, Harness};

on_every_store!(delivered_text_is_counted_and_charged_and_teaches_nothing);

const CONFIG: &str = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 100000, period = "1d" }] }
"#;

/// "Hello, world!" is 4 tokens in o200k_base (gpt-4o's encoding).
const TEXT: &str = "Hello, world!";

async fn reserve(h: &mut Harness) -> pb::CheckAndReserveResponse {
    let r = h
        .client
        .check_and_reserve(pb::CheckAndReserveRequest {
            tenant_id: "acme".into(),
            tier: "t".into(),
            model: "gpt-4o".into(),
            prompt: "Say hello to the world, politely.".into(),
            max_output_tokens: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:#?}");
    r
}

async fn tokens_left(h: &mut Harness) -> i64 {
    let s = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            tier: "t".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    support::limit(&s.limits, Level::Tenant, Dimension::Tokens, 86_400).remaining
}

/// Estimator samples stored in Redis, over every key.
fn samples(redis: &support::RedisServer) -> i64 {
    let mut conn = redis.conn();
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("ctxb:e:*")
        .query(&mut conn)
        .unwrap();
    keys.iter()
        .map(|k| ::redis::cmd("LLEN").arg(k).query::<i64>(&mut conn).unwrap())
        .sum()
}

async fn delivered_text_is_counted_and_charged_and_teaches_nothing(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let r = reserve(&mut h).await;
    let prompt = r.reserved_tokens - r.granted_max_output_tokens;

    // Both counts at once: refused, nothing settled.
    let both = h
        .client
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: prompt,
            completion_tokens: 4,
            completion_text: TEXT.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(both.code(), tonic::Code::InvalidArgument, "{both:?}");
    assert!(both.message().contains("completion_text"), "{both:?}");

    let before = tokens_left(&mut h).await;
    let c = h
        .client
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: prompt,
            completion_text: TEXT.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(c.outcome(), Outcome::Applied);
    assert_eq!(
        c.completion_tokens, 4,
        "the text counted with gpt-4o's tokenizer"
    );
    assert_eq!(c.token_delta, 4 - r.granted_max_output_tokens as i64);
    assert_eq!(
        c.estimation_ratio, 0.0,
        "no sample from a prompt as reserved"
    );
    let after = tokens_left(&mut h).await;
    assert!(
        (after - before - (r.granted_max_output_tokens as i64 - 4)).abs() <= 2,
        "the unused output came back: {before} → {after}"
    );
    if let Some(redis) = &h.redis {
        let samples = samples(redis);
        assert_eq!(samples, 0, "the estimator learned nothing");
    }

    // The upstream's own count still teaches the estimator.
    let r = reserve(&mut h).await;
    let c = h
        .client
        .commit(pb::CommitRequest {
            reservation_id: r.reservation_id,
            prompt_tokens: r.estimated_prompt_tokens,
            completion_tokens: 4,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((c.completion_tokens, c.estimation_ratio), (4, 1.0));
    if let Some(redis) = &h.redis {
        let samples = samples(redis);
        assert_eq!(samples, 1, "one sample, from the upstream's count");
    }
    h.stop().await;
}
