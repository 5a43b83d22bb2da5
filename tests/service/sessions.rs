//! The session level on every store, over gRPC: a session's dollar cap stops
//! one agent run while its user starts another; 50 concurrent calls of one
//! session never hold more than its concurrency; a session's keys expire
//! after the tier's `session_ttl` unused; the same id under two users is two
//! sessions; GetStatus reports a session's limits; hostile ids are refused
//! or kept apart.

use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Reason};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Backend, Harness, limit, reserve};
use tonic::Code;

on_every_store!(
    a_sessions_dollar_cap_stops_the_run_while_its_user_starts_another,
    fifty_concurrent_calls_of_one_session_hold_at_most_its_concurrency,
    a_sessions_keys_expire_after_its_ttl_unused,
    sessions_are_their_users_and_hostile_ids_change_nothing,
    a_models_session_limits_apply_to_its_calls,
);

const CONFIG: &str = r#"
[models.gpt-4o]
match = ["gpt-4o*"]

[models.mini]
match = ["mini*"]

[prices.gpt-4o]
input = 2.50
output = 10.00

[prices.mini]
input = 0.15
output = 0.60

[tiers.t]
max_context_tokens = 200000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 100000, period = "1h" }], concurrency = 200 }
user = { spend = [{ limit_usd = 5.00, period = "1d" }], concurrency = 100 }
session = { spend = [{ limit_usd = 0.10, period = "1d" }], requests = [{ limit = 1000, period = "1d" }], concurrency = 4 }
session_ttl = "1h"

[tiers.t.models.mini]
session = { requests = [{ limit = 2, period = "1d" }] }

[tiers.short]
max_context_tokens = 200000
default_max_output_tokens = 100
user = { requests = [{ limit = 100, period = "1d" }] }
session = { requests = [{ limit = 1, period = "1d" }] }
session_ttl = "1s"
"#;

fn ask(user: &str, session: &str, prompt: u64, output: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        session_id: session.into(),
        ..reserve("acme", user, "t", prompt, output)
    }
}

async fn call(h: &mut Harness, req: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    h.client.check_and_reserve(req).await.unwrap().into_inner()
}

async fn refund(h: &mut Harness, id: &str) {
    let r = h
        .client
        .refund(pb::RefundRequest {
            reservation_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome(), pb::Outcome::Applied);
}

async fn a_sessions_dollar_cap_stops_the_run_while_its_user_starts_another(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    // 10,000 prompt and 1,000 output tokens of gpt-4o: $0.035 at most.
    let mut taken = Vec::new();
    let denied = loop {
        let r = call(&mut h, ask("alice", "run-1", 10_000, 1_000)).await;
        if !r.allowed {
            break r;
        }
        taken.push(r.reservation_id);
        assert!(taken.len() <= 2, "the run's $0.10 holds two calls");
    };
    assert_eq!(taken.len(), 2);
    assert_eq!(denied.reason(), Reason::BudgetExceeded, "{denied:#?}");
    assert_eq!(
        (denied.limiting_level(), denied.limiting_dimension()),
        (Level::Session, Dimension::Spend)
    );
    assert!(denied.retry_after_ms > 0, "a denial says when to retry");
    assert!(
        denied.detail.contains("session"),
        "the detail names the level: {}",
        denied.detail
    );
    // The user still has room: another run starts.
    let other = call(&mut h, ask("alice", "run-2", 10_000, 1_000)).await;
    assert!(other.allowed, "{other:#?}");
    let session_spend = limit(&other.limits, Level::Session, Dimension::Spend, 86_400);
    assert_eq!(
        session_spend.remaining,
        100_000 - 35_000,
        "µ$ left in run-2"
    );
    // Committing run-1's calls at their real (smaller) cost gives the run room again.
    for id in &taken {
        let c = h
            .client
            .commit(pb::CommitRequest {
                reservation_id: id.clone(),
                prompt_tokens: 2_000,
                completion_tokens: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(c.outcome(), pb::Outcome::Applied);
    }
    let again = call(&mut h, ask("alice", "run-1", 10_000, 1_000)).await;
    assert!(again.allowed, "committed below the reservation: {again:#?}");
}

async fn fifty_concurrent_calls_of_one_session_hold_at_most_its_concurrency(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    // Every call holds its lease until all 50 are answered: exactly the
    // session's 4 slots are taken, whatever the interleaving.
    let answered = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let mut client = h.client.clone();
        let answered = answered.clone();
        tasks.push(tokio::spawn(async move {
            let r = client
                .check_and_reserve(ask("alice", "agent-7", 10, 10))
                .await
                .unwrap()
                .into_inner();
            answered.wait().await;
            r
        }));
    }
    let mut allowed = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        match r.allowed {
            true => allowed.push(r.reservation_id),
            false => {
                assert_eq!(
                    (r.limiting_level(), r.limiting_dimension(), r.reason()),
                    (
                        Level::Session,
                        Dimension::Concurrency,
                        Reason::ConcurrencyExceeded
                    ),
                    "{r:#?}"
                );
            }
        }
    }
    assert_eq!(allowed.len(), 4, "the session's concurrency is 4");
    // The user's other sessions are not held back by this one.
    let elsewhere = call(&mut h, ask("alice", "agent-8", 10, 10)).await;
    assert!(elsewhere.allowed, "{elsewhere:#?}");
    refund(&mut h, &elsewhere.reservation_id).await;
    for id in &allowed {
        refund(&mut h, id).await;
    }
    let freed = call(&mut h, ask("alice", "agent-7", 10, 10)).await;
    assert!(
        freed.allowed,
        "refunds free the session's slots: {freed:#?}"
    );
}

async fn a_sessions_keys_expire_after_its_ttl_unused(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let ask_short = || pb::CheckAndReserveRequest {
        session_id: "run".into(),
        ..reserve("acme", "alice", "short", 10, 10)
    };
    let first = call(&mut h, ask_short()).await;
    assert!(first.allowed, "{first:#?}");
    let started = Instant::now();
    let second = call(&mut h, ask_short()).await;
    assert!(!second.allowed, "one request a day per session");
    assert_eq!(second.limiting_level(), Level::Session);
    if let Some(redis) = &h.redis {
        // The key lives at most twice session_ttl past its last write, plus a second.
        let mut conn = redis.conn();
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg("ctxb:*:s:*")
            .query(&mut conn)
            .unwrap();
        assert_eq!(keys.len(), 1, "one session key: {keys:?}");
        let ttl: i64 = ::redis::cmd("PTTL").arg(&keys[0]).query(&mut conn).unwrap();
        assert!(
            (1..=3_000).contains(&ttl),
            "a day's bucket, yet the key lives {ttl} ms"
        );
    }
    // Unused for its session_ttl, the session is gone: a fresh one under
    // the same id (the user's day of requests goes on).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = call(&mut h, ask_short()).await;
        if r.allowed {
            let user = limit(&r.limits, Level::User, Dimension::Requests, 86_400);
            assert_eq!(user.remaining, 98, "the user's requests are not reset");
            break;
        }
        assert!(Instant::now() < deadline, "the session never expired");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "expired before session_ttl: {:?}",
        started.elapsed()
    );
}

async fn sessions_are_their_users_and_hostile_ids_change_nothing(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    let mini = |user: &str, session: &str| pb::CheckAndReserveRequest {
        model: "mini-1".into(),
        ..ask(user, session, 10, 10)
    };
    // The same id under two users, and under no user, is three sessions.
    for user in ["alice", "bob", ""] {
        for _ in 0..2 {
            let r = call(&mut h, mini(user, "run:{1}")).await;
            assert!(r.allowed, "{user}: {r:#?}");
        }
        let r = call(&mut h, mini(user, "run:{1}")).await;
        assert!(!r.allowed, "{user}: mini's two calls a session");
        assert_eq!(r.limiting_level(), Level::Session);
    }
    // Ids that look like key syntax are just ids.
    for id in ["run", "run:{1}:x", "r}u{n", "ü🙂", &"x".repeat(256)] {
        let r = call(&mut h, mini("carol", id)).await;
        assert!(r.allowed, "{id:?} is a fresh session: {r:#?}");
    }
    // Malformed ids are refused, naming the field, and change nothing.
    for bad in ["run\n1", "\u{7f}", &"x".repeat(257)] {
        let err = h
            .client
            .check_and_reserve(mini("dave", bad))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
        assert!(err.message().contains("session_id"), "{}", err.message());
        let err = h
            .client
            .get_status(pb::GetStatusRequest {
                tenant_id: "acme".into(),
                user_id: "dave".into(),
                session_id: bad.into(),
                tier: "t".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{bad:?}");
    }
    for _ in 0..2 {
        assert!(call(&mut h, mini("dave", "run")).await.allowed);
    }
    // GetStatus shows the session's limits, and its usage.
    let status = h
        .client
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
            session_id: "run:{1}".into(),
            tier: "t".into(),
            model: "mini-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let requests = status
        .limits
        .iter()
        .find(|l| {
            l.level() == Level::Session
                && l.dimension() == Dimension::Requests
                && l.model_group == "mini"
        })
        .expect("the session's mini requests");
    assert_eq!((requests.limit, requests.remaining), (2, 0));
    let slots = status
        .leases
        .iter()
        .find(|l| l.level() == Level::Session && l.model_group.is_empty())
        .expect("the session's leases");
    assert_eq!((slots.active, slots.limit), (2, 4));
}

async fn a_models_session_limits_apply_to_its_calls(backend: Backend) {
    let mut h = Harness::start(backend, CONFIG).await;
    for _ in 0..2 {
        assert!(call(&mut h, ask("erin", "s", 10, 10)).await.allowed);
    }
    // mini's two calls a session are the group's alone: gpt-4o calls took none.
    let mini = pb::CheckAndReserveRequest {
        model: "mini-1".into(),
        ..ask("erin", "s", 10, 10)
    };
    for _ in 0..2 {
        assert!(call(&mut h, mini.clone()).await.allowed);
    }
    let r = call(&mut h, mini).await;
    assert!(!r.allowed);
    assert_eq!(
        (
            r.limiting_level(),
            r.limiting_dimension(),
            r.limiting_model_group.as_str()
        ),
        (Level::Session, Dimension::Requests, "mini")
    );
    // A request naming no session skips the level.
    let sessionless = pb::CheckAndReserveRequest {
        model: "mini-1".into(),
        ..reserve("acme", "erin", "t", 10, 10)
    };
    assert!(call(&mut h, sessionless).await.allowed);
}
