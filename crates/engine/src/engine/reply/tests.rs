//! The answer to CheckAndReserve from each kind of store reply, without a
//! store: the outcome is a function of the plan, the reply and the count.

use super::*;
use crate::domain::bucket::BucketSpec;
use crate::domain::budget::{DeniedChecks, Reclaimed};
use crate::domain::decision::Reading;
use crate::domain::plan::LevelPlan;
use crate::domain::{IdempotencyKey, Reason, ReservationId, TenantId};

/// A user level of 6,000 tokens a minute and 2 leases; 100 prompt tokens
/// (the service's count of 80, corrected) and up to 50 of output, at
/// least 20.
fn plan() -> ReservePlan {
    let tokens = BucketSpec {
        level: Level::User,
        dimension: Dimension::Tokens,
        limit: 6000,
        period_secs: 60,
        group: 0,
        window: None,
        alert_at: Default::default(),
    };
    ReservePlan {
        id: ReservationId::generate(
            TenantId::parse("t").unwrap(),
            None,
            "free".into(),
            "gpt-4o".into(),
        ),
        levels: vec![LevelPlan {
            level: Level::User,
            group: None,
            slots: false,
            buckets: vec![tokens],
            concurrency: Some(2),
            overrun: None,
            idle_secs: None,
        }],
        model_group: None,
        headroom: 0.0,
        price: Default::default(),
        prompt_tokens: 100,
        max_output_tokens: 50,
        min_output_tokens: 20,
        estimated_prompt_tokens: 80,
        prompt_mix: None,
        learned_output: None,
        lease_ttl_ms: 30_000,
        idempotency_key: Some(IdempotencyKey::parse("k").unwrap()),
        fingerprint: 7,
        declared: Default::default(),
    }
}

fn count() -> PromptCount {
    PromptCount {
        tokens: 80,
        more_than: None,
        reserve: 100,
        estimated: 80,
        estimator: "gpt-4o".into(),
        multiplier: 1.25,
        mix: None,
    }
}

fn how() -> Answered {
    Answered {
        degraded: false,
        concurrency_retry_ms: 5_000,
        jitter_ms: 7,
        statuses: Statuses::All,
    }
}

/// A denial as another part of the engine made it.
fn elsewhere(reason: Reason) -> Denial {
    Denial {
        reason,
        level: Some(Level::Tenant),
        dimension: None,
        period_secs: 0,
        model_group: None,
        retry_after_ms: 0,
        detail: "elsewhere".into(),
    }
}

fn readings(milli: i64, active: u64) -> Vec<Reading> {
    vec![
        Reading::Bucket { milli },
        Reading::Concurrency {
            active,
            earliest_expiry_ms: 1_000,
        },
    ]
}

#[test]
fn an_allowed_reply_reserves_the_prompt_and_the_output_granted() {
    let plan = plan();
    let reply = ReserveReply::Allowed {
        readings: readings(5_000_000, 1),
        granted_output: 30,
        reserved_output: 30,
        reclaimed: Reclaimed::default(),
    };
    let out = outcome(&plan, reply, &count(), how()).unwrap();
    assert_eq!(out.denial, None);
    assert_eq!(out.reservation_id, Some(plan.id.to_string()));
    assert_eq!(
        (out.reserved_tokens, out.max_output_tokens),
        (130, 50),
        "prompt + granted, of the 50 asked for"
    );
    assert_eq!(out.granted_max_output_tokens, 30);
    assert_eq!(out.lease_expires_in_ms, 30_000);
    // Where every level holds a learned output, less is reserved than granted.
    let learned = ReserveReply::Allowed {
        readings: readings(5_000_000, 1),
        granted_output: 30,
        reserved_output: 12,
        reclaimed: Reclaimed::default(),
    };
    let out = outcome(&plan, learned, &count(), how()).unwrap();
    assert_eq!(
        (
            out.reserved_tokens,
            out.reserved_output_tokens,
            out.granted_max_output_tokens
        ),
        (112, 12, 30)
    );
    assert_eq!(
        (out.estimated_prompt_tokens, out.estimator_multiplier),
        (80, 1.25)
    );
    assert_eq!(out.limits.len(), 2, "the bucket and the leases");
    assert!(!out.replayed && !out.degraded && out.shadow_denial.is_none());
}

#[test]
fn a_denied_reply_says_what_would_have_been_reserved_and_when_to_retry() {
    let plan = plan();
    let mut denied_mask = DeniedChecks::default();
    denied_mask.insert(1);
    let reply = ReserveReply::Denied {
        readings: readings(5_000_000, 2),
        denied_mask,
        reclaimed: Reclaimed::default(),
    };
    let out = outcome(
        &plan,
        reply,
        &count(),
        Answered {
            degraded: true,
            ..how()
        },
    )
    .unwrap();
    let denial = out.denial.expect("denied");
    assert_eq!(denial.reason, Reason::ConcurrencyExceeded);
    assert_eq!(
        denial.retry_after_ms,
        1_000 + 7,
        "the lease's expiry, jittered"
    );
    assert_eq!(out.reservation_id, None);
    assert_eq!(
        (out.reserved_tokens, out.granted_max_output_tokens),
        (150, 0)
    );
    assert_eq!(out.lease_expires_in_ms, 0);
    assert!(out.degraded && out.shadow_denial.is_none());
}

#[test]
fn a_replayed_reply_answers_the_earlier_reservation() {
    let plan = plan();
    let earlier =
        ReservationId::generate(plan.id.tenant.clone(), None, "free".into(), "gpt-4o".into());
    let reply = ReserveReply::Replayed {
        nonce: earlier.nonce_b64(),
        tokens: 140,
        lease_expires_in_ms: 12_000,
        readings: readings(4_000_000, 1),
        reclaimed: Reclaimed::default(),
    };
    let out = outcome(&plan, reply, &count(), how()).unwrap();
    assert!(out.replayed);
    assert_eq!(out.reservation_id, Some(earlier.to_string()));
    assert_eq!(
        (
            out.reserved_tokens,
            out.granted_max_output_tokens,
            out.reserved_output_tokens
        ),
        (140, 40, 40)
    );
    assert_eq!(out.lease_expires_in_ms, 12_000);
    let bad = ReserveReply::Replayed {
        nonce: "not a nonce".into(),
        tokens: 140,
        lease_expires_in_ms: 12_000,
        readings: readings(4_000_000, 1),
        reclaimed: Reclaimed::default(),
    };
    assert!(matches!(
        outcome(&plan, bad, &count(), how()),
        Err(EngineError::Store(StoreError::Protocol(_)))
    ));
}

#[test]
fn a_spent_or_conflicting_key_is_an_error_not_a_decision() {
    let plan = plan();
    let spent = ReserveReply::IdempotencySpent { settled: true };
    assert!(matches!(
        outcome(&plan, spent, &count(), how()),
        Err(EngineError::FailedPrecondition(m)) if m.contains("already committed or refunded")
    ));
    let conflict = ReserveReply::IdempotencyConflict;
    assert!(matches!(
        outcome(&plan, conflict, &count(), how()),
        Err(EngineError::Invalid(e)) if e.field == "idempotency_key"
    ));
}

#[test]
fn answers_before_the_store_carry_the_count() {
    let blocked = ReserveOutcome::blocked(elsewhere(Reason::Blocked));
    assert_eq!(
        (
            blocked.estimated_prompt_tokens,
            blocked.estimator_multiplier
        ),
        (0, 1.0)
    );
    let denial = elsewhere(Reason::ContextTooLarge);
    let refused = ReserveOutcome::refused(denial, 9_000, 1_000, &count(), Vec::new());
    assert_eq!(
        (refused.reserved_tokens, refused.max_output_tokens),
        (9_000, 1_000)
    );
    assert_eq!(refused.estimator_multiplier, 1.25);
    assert_eq!(refused.granted_max_output_tokens, 0);
}
