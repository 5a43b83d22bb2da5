//! CheckAndReserve with fallback candidates, on every store: the first model
//! whose limits all have room is reserved and named; those skipped say why
//! and hold nothing; the first is taken again once it refills; when none
//! fits, the first candidate's denial with the earliest retry. Under 200
//! concurrent callers no candidate's limit is overspent. Bad combinations
//! are INVALID_ARGUMENT and change nothing.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Reason};
use std::time::{Duration, Instant};
use support::{Backend, Harness, reserve};

on_every_store!(
    the_next_candidate_is_taken_while_the_first_is_spent_and_the_first_once_it_refills,
    when_no_candidate_fits_the_first_denial_answers_with_the_earliest_retry,
    concurrent_callers_never_overspend_any_candidate,
    bad_candidate_lists_are_refused_and_change_nothing,
    a_later_candidates_error_answers_only_once_the_earlier_are_denied,
    under_a_quota_in_shadow_each_candidate_is_checked_against_it,
);

const CONFIG: &str = r#"
[models.big]
match = ["big-*"]
global = { tokens = [{ limit = 1000, period = "2s" }] }

[models.small]
match = ["small-*"]
global = { tokens = [{ limit = 1000, period = "1h" }] }

[models.steady]
match = ["steady-*"]
global = { tokens = [{ limit = 5000, period = "1h" }] }

[models.other]
match = ["other-*"]
global = { tokens = [{ limit = 5000, period = "1h" }] }

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100000, period = "1h" }] }

[tiers.watched]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100000, period = "1h" }] }
shadow = { tenant = { requests = [{ limit = 2, period = "1h" }] } }
"#;

fn ask(models: &[&str], tenant: &str) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        model: String::new(),
        candidate_models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..reserve(tenant, "alice", "t", 100, 400)
    }
}

async fn call(h: &mut Harness, req: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    h.client.check_and_reserve(req).await.unwrap().into_inner()
}

/// The model group's global token limit, as GetStatus reports it.
async fn group_tokens(h: &mut Harness, model: &str, period: u64) -> pb::LimitStatus {
    let s = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            tier: "t".into(),
            model: model.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    s.limits
        .iter()
        .find(|l| {
            l.level() == Level::Global
                && l.dimension() == Dimension::Tokens
                && l.period_seconds == period
                && !l.model_group.is_empty()
        })
        .cloned()
        .expect("the group's global token limit")
}

async fn the_next_candidate_is_taken_while_the_first_is_spent_and_the_first_once_it_refills(
    backend: Backend,
) {
    let mut h = Harness::start(backend, CONFIG).await;
    let candidates = ["big-1", "small-1"];
    // big holds 1000 a 2 s: two calls of 500 fit, then small is taken.
    let mut on_big = 0;
    let fell_back = loop {
        let r = call(&mut h, ask(&candidates, "acme")).await;
        assert!(r.allowed, "{r:#?}");
        if r.chosen_model == "small-1" {
            break r;
        }
        assert_eq!(r.chosen_model, "big-1");
        assert!(r.skipped_candidates.is_empty());
        on_big += 1;
        assert!(on_big <= 6, "big never ran out: {r:#?}");
    };
    assert!(on_big >= 2, "two calls fit in big first");
    let skipped = &fell_back.skipped_candidates;
    assert_eq!(skipped.len(), 1, "{fell_back:#?}");
    let s = &skipped[0];
    assert_eq!(s.model, "big-1");
    assert_eq!(s.reason(), Reason::TpmExceeded);
    assert_eq!(
        (s.level(), s.dimension()),
        (Level::Global, Dimension::Tokens)
    );
    assert_eq!(s.model_group, "big");
    assert!(s.retry_after_ms > 0 && s.retry_after_ms <= 2000, "{s:?}");
    // Nothing held on big: its bucket is as the big calls left it.
    let small = group_tokens(&mut h, "small-1", 3600).await;
    assert_eq!(small.remaining, 500, "one call reserved on small");
    // Once big refills, it is taken again.
    tokio::time::sleep(Duration::from_millis(s.retry_after_ms)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = call(&mut h, ask(&candidates, "acme")).await;
        if r.chosen_model == "big-1" {
            break;
        }
        assert!(Instant::now() < deadline, "big never refilled: {r:#?}");
        h.client
            .refund(pb::RefundRequest {
                reservation_id: r.reservation_id,
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn when_no_candidate_fits_the_first_denial_answers_with_the_earliest_retry(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    // small (1000 an hour) holds two calls; big (1000 every 2 s) too.
    for model in ["small-1", "small-1", "big-1", "big-1"] {
        let r = call(&mut h, ask(&[model], "acme")).await;
        assert!(r.allowed && r.chosen_model == model, "{r:#?}");
    }
    let r = call(&mut h, ask(&["small-1", "big-1"], "acme")).await;
    assert!(!r.allowed, "{r:#?}");
    assert!(r.chosen_model.is_empty() && r.reservation_id.is_empty());
    assert_eq!(r.reason(), Reason::TpmExceeded);
    assert_eq!(
        r.limiting_model_group, "small",
        "the first candidate's denial"
    );
    let names: Vec<&str> = r
        .skipped_candidates
        .iter()
        .map(|s| s.model.as_str())
        .collect();
    assert_eq!(names, ["small-1", "big-1"]);
    let big_retry = r.skipped_candidates[1].retry_after_ms;
    assert!(
        r.skipped_candidates[0].retry_after_ms > 60_000,
        "small refills slowly"
    );
    assert!(big_retry <= 2000, "{big_retry}");
    assert_eq!(r.retry_after_ms, big_retry, "the earliest retry among all");
}

async fn concurrent_callers_never_overspend_any_candidate(backend: Backend) {
    let h = std::sync::Arc::new(tokio::sync::Mutex::new(
        Harness::start(backend, CONFIG).await,
    ));
    let addr = h.lock().await.addr;
    let mut tasks = Vec::new();
    for i in 0..200 {
        tasks.push(tokio::spawn(async move {
            let mut c = support::connect(addr).await;
            let r = c
                .check_and_reserve(ask(&["steady-1", "other-1"], &format!("t{}", i % 7)))
                .await
                .unwrap()
                .into_inner();
            if !r.allowed {
                return None;
            }
            // Each call uses all it reserved.
            c.commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: 100,
                completion_tokens: 400,
                ..Default::default()
            })
            .await
            .unwrap();
            Some(r.chosen_model)
        }));
    }
    let (mut steady, mut other) = (0, 0);
    for t in tasks {
        match t.await.unwrap().as_deref() {
            Some("steady-1") => steady += 1,
            Some("other-1") => other += 1,
            Some(m) => panic!("chose {m}"),
            None => {}
        }
    }
    // 5000 an hour each, 500 a call: at most 10 on each, and both were used.
    assert!(
        steady <= 10 && other <= 10,
        "steady {steady}, other {other}"
    );
    match backend {
        // A replica decides the global level from its leased share of it:
        // it may fall back before the first candidate is spent.
        Backend::Cluster => assert!(steady > 0 && other > 0, "{steady}, {other}"),
        _ => assert_eq!((steady, other), (10, 10), "each candidate filled, in order"),
    }
    let mut h = h.lock().await;
    for model in ["steady-1", "other-1"] {
        let l = group_tokens(&mut h, model, 3600).await;
        assert!(l.remaining >= 0, "{model} overspent: {l:?}");
    }
}

async fn bad_candidate_lists_are_refused_and_change_nothing(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let before = group_tokens(&mut h, "small-1", 3600).await.remaining;
    let mismatch = pb::CheckAndReserveRequest {
        model: "big-1".into(),
        ..ask(&["small-1", "big-1"], "acme")
    };
    let keyed = pb::CheckAndReserveRequest {
        idempotency_key: "k1".into(),
        ..ask(&["small-1"], "acme")
    };
    let many = ask(&["small-1"; 9], "acme");
    let blank = ask(&["small-1", ""], "acme");
    let twice = ask(&["small-1", "big-1", "small-1"], "acme");
    for (req, says) in [
        (mismatch, "first candidate"),
        (keyed, "idempotency_key"),
        (many, "at most 8"),
        (blank, "empty"),
        (twice, "twice"),
    ] {
        let e = h.client.check_and_reserve(req).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains("candidate_models") && e.message().contains(says),
            "{e:?}"
        );
    }
    assert_eq!(
        group_tokens(&mut h, "small-1", 3600).await.remaining,
        before
    );
    // model equal to the first candidate is fine.
    let same = pb::CheckAndReserveRequest {
        model: "small-1".into(),
        ..ask(&["small-1", "big-1"], "acme")
    };
    let r = call(&mut h, same).await;
    assert_eq!(r.chosen_model, "small-1", "{r:#?}");
}

const PRICED: &str = r#"
[money]
require_price = true

[models.priced]
match = ["priced-*"]
global = { requests = [{ limit = 1, period = "1h" }] }

[models.unpriced]
match = ["unpriced-*"]

[prices.priced]
input = 1.00
output = 1.00

[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 100
tenant = { spend = [{ limit_usd = 100.00, period = "1d" }] }
"#;

/// Under `require_price`, a candidate without a price is an error only when
/// it is reached: while an earlier candidate has room, the call is served.
async fn a_later_candidates_error_answers_only_once_the_earlier_are_denied(backend: Backend) {
    let mut h = Harness::start(backend, PRICED).await;
    let r = call(&mut h, ask(&["priced-1", "unpriced-1"], "acme")).await;
    assert!(r.allowed, "{r:#?}");
    assert_eq!(r.chosen_model, "priced-1");
    // priced takes one request an hour: now the unpriced candidate is reached.
    let e = h
        .client
        .check_and_reserve(ask(&["priced-1", "unpriced-1"], "acme"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("unpriced-1"), "{}", e.message());
}

/// A tier with a quota in shadow sends its candidates to the store together
/// like any other; the quota in shadow is checked for the candidate taken,
/// as for one model.
async fn under_a_quota_in_shadow_each_candidate_is_checked_against_it(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let ask = |models: &[&str]| pb::CheckAndReserveRequest {
        tier: "watched".into(),
        ..ask(models, "acme")
    };
    let mut shadow = Vec::new();
    let mut fell_back = false;
    for _ in 0..4 {
        let r = call(&mut h, ask(&["small-1", "steady-1"])).await;
        assert!(r.allowed, "{r:#?}");
        fell_back |= r.chosen_model == "steady-1";
        shadow.push(r.shadow_denied);
    }
    // small holds 1000 tokens an hour, 500 a call: the third call falls back.
    assert!(fell_back, "small ran out");
    assert_eq!(
        shadow,
        [false, false, true, true],
        "the shadow quota's 2 an hour"
    );
}
