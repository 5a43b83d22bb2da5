//! What the operator commands print, as a shell sees it: a reader that goes
//! away early (`ctxbudget inspect … | head`) ends the command quietly, with
//! status 0 and nothing on stderr, for every command that prints; and
//! `inspect` names leases by the reservation ids gateways log.

use crate::support;

use crate::operations::ctl_ok;
use ctxbudget::pb;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use support::{Backend, Harness, RedisServer, reserve};

/// Runs the real binary with its stdout a pipe whose reader is already
/// closed (as after `head` exits): every write it makes fails with `EPIPE`.
/// Returns whether it exited 0, and its stderr.
fn run_into_closed_pipe(redis: &RedisServer, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let url = redis.url();
    let out = Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
        .args(args)
        .args(["--redis-url", &url])
        .env_remove("CTXBUDGET_REDIS_URL")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the ctxbudget binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printing_command_ends_quietly_when_its_reader_goes_away() {
    let mut h = Harness::start(Backend::Redis, "").await;
    let r = h
        .client
        .check_and_reserve(reserve("acme", "alice", "free", 100, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");
    let redis = h.redis.take().expect("a Redis-backed harness");
    let dates = ["--from", "2026-01-01", "--to", "2026-01-02"];
    let commands: Vec<Vec<&str>> = vec![
        vec![
            "inspect", "--tenant", "acme", "--user", "alice", "--tier", "free",
        ],
        vec!["inspect", "--tenant", "acme", "--json"],
        vec!["tiers", "list"],
        vec!["tiers", "get", "free"],
        vec!["tiers", "history"],
        vec!["global", "get"],
        [&["usage", "--tenant", "acme"][..], &dates].concat(),
        [
            &["usage", "--tenant", "acme", "--format", "csv"][..],
            &dates,
        ]
        .concat(),
        vec!["--help"],
    ];
    for args in commands {
        let url = redis.url();
        let shown = Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
            .args(&args)
            .args(["--redis-url", &url])
            .output()
            .unwrap();
        assert!(
            shown.status.success() && !shown.stdout.is_empty(),
            "ctxbudget {args:?} prints: {shown:?}"
        );
        let (code, stderr) = run_into_closed_pipe(&redis, &args);
        assert_eq!(
            (code, stderr.as_str()),
            (Some(0), ""),
            "ctxbudget {args:?} into a closed pipe"
        );
    }
    h.stop().await;
}

/// `inspect` shows each of the tenant's leases under the `rsv_…` id its
/// client holds (rebuilt from the nonce and the record's owner tag), a lease
/// it cannot rebuild (another user's) by its nonce, and leaves other tenants'
/// leases at the global level out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_reservation_ids_clients_hold() {
    const CONFIG: &str = "[global]\nconcurrency = 100\n\n[models.gpt-4o]\nmatch = [\"gpt-4o\"]\n";
    let mut h = Harness::start(Backend::Redis, CONFIG).await;
    let mut reserve_ok = async |request: pb::CheckAndReserveRequest| {
        let r = h
            .client
            .check_and_reserve(request)
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed, "{r:?}");
        r.reservation_id
    };
    // Alice's: one counted by the caller, one by the service (an estimator key).
    let counted = reserve_ok(reserve("acme", "alice", "pro", 100, 10)).await;
    let messages = reserve_ok(pb::CheckAndReserveRequest {
        prompt_tokens: None,
        messages: vec![pb::Message {
            role: "user".into(),
            content: "How many tokens is this?".into(),
            name: String::new(),
        }],
        ..reserve("acme", "alice", "pro", 0, 10)
    })
    .await;
    let bobs = reserve_ok(reserve("acme", "bob", "pro", 100, 10)).await;
    reserve_ok(reserve("zeta", "zoe", "pro", 100, 10)).await;
    let redis = h.redis.take().expect("a Redis-backed harness");

    let report = |user: &str| {
        let out = ctl_ok(
            &redis,
            &[
                "inspect", "--tenant", "acme", "--user", user, "--tier", "pro", "--json",
            ],
        );
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let alice = report("alice");
    let leases = alice["leases"].as_array().unwrap();
    let ids = |level: &str| -> BTreeSet<Option<&str>> {
        leases
            .iter()
            .filter(|l| l["level"] == level)
            .map(|l| l["reservation_id"].as_str())
            .collect()
    };
    let hers = BTreeSet::from([Some(counted.as_str()), Some(messages.as_str())]);
    assert_eq!(ids("user"), hers, "{alice:#}");
    let mut tenant = hers.clone();
    tenant.insert(None);
    assert_eq!(ids("tenant"), tenant, "Bob's is not rebuilt: {alice:#}");
    assert_eq!(ids("global"), tenant, "{alice:#}");
    assert_eq!(alice["other_tenants_leases"], 1, "Zoe's: {alice:#}");
    let bob = report("bob");
    let his: BTreeSet<&str> = bob["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["reservation_id"].as_str())
        .collect();
    assert!(his.contains(bobs.as_str()), "{bob:#}");

    let text = ctl_ok(
        &redis,
        &[
            "inspect", "--tenant", "acme", "--user", "alice", "--tier", "pro",
        ],
    );
    assert!(
        text.contains(&counted) && text.contains(&messages) && text.contains("nonce "),
        "{text}"
    );
    h.stop().await;
}

/// `inspect --session` adds the session level: its buckets against the
/// tier's session limits, and its leases under the ids their clients hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_sessions_buckets_and_leases() {
    const CONFIG: &str = r#"
[tiers.agents]
max_context_tokens = 100000
default_max_output_tokens = 100
user = { requests = [{ limit = 100, period = "1h" }] }
session = { requests = [{ limit = 10, period = "1h" }], concurrency = 4 }
"#;
    let mut h = Harness::start(Backend::Redis, CONFIG).await;
    let mut ids = Vec::new();
    for session in ["run-1", "run-1", "run-2"] {
        let r = h
            .client
            .check_and_reserve(pb::CheckAndReserveRequest {
                session_id: session.into(),
                ..reserve("acme", "alice", "agents", 100, 10)
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed, "{r:?}");
        ids.push(r.reservation_id);
    }
    let redis = h.redis.take().expect("a Redis-backed harness");
    let out = ctl_ok(
        &redis,
        &[
            "inspect",
            "--tenant",
            "acme",
            "--user",
            "alice",
            "--session",
            "run-1",
            "--tier",
            "agents",
            "--json",
        ],
    );
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["session"], "run-1", "{report:#}");
    let requests = report["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["level"] == "session")
        .unwrap_or_else(|| panic!("the session's bucket: {report:#}"));
    assert_eq!(
        (&requests["dimension"], &requests["limit"]),
        (&Value::from("requests"), &Value::from(10)),
        "{requests}"
    );
    let left = requests["level_now"].as_f64().unwrap();
    assert!(
        (8.0..8.1).contains(&left),
        "two of its ten requests taken (refilling since): {requests}"
    );
    let leases: BTreeSet<&str> = report["leases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["level"] == "session")
        .filter_map(|l| l["reservation_id"].as_str())
        .collect();
    assert_eq!(
        leases,
        BTreeSet::from([ids[0].as_str(), ids[1].as_str()]),
        "run-1's leases, named: {report:#}"
    );
    let text = ctl_ok(
        &redis,
        &[
            "inspect",
            "--tenant",
            "acme",
            "--user",
            "alice",
            "--session",
            "run-1",
            "--tier",
            "agents",
        ],
    );
    assert!(text.contains("session"), "{text}");
    h.stop().await;
}
