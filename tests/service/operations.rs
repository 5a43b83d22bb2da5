//! Operating a multi-replica setup: quota changes through `ctxbudget tiers|
//! overrides` reach every replica within a second without a restart or a failed
//! request, a lost notification is caught by the version check, bad changes are
//! refused whole, overrides and shadow quotas behave, the audit log records who
//! changed what, and SIGHUP reloads a file in memory mode.

use crate::support;

use clap::Parser;
use ctxbudget::cli::Cli;
use ctxbudget::pb::{self, Dimension, Level, Reason};
use ctxbudget::store::config_repo::ConfigStore;
use ctxbudget::store::redis::Endpoint;
use redis::Commands;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use support::{Backend, Harness, RedisServer, limit, reserve, settings};

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

const TIER: &str = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100000, period = "1d" }] }
user = { requests = [{ limit = 100, period = "1d" }] }
"#;

/// Runs `ctxbudget <args>` as an operator would, against `redis`.
pub(crate) async fn ctl(redis: &RedisServer, args: &[&str]) -> anyhow::Result<()> {
    let url = redis.url();
    let mut argv = vec!["ctxbudget"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--redis-url", &url, "--actor", "test-operator"]);
    ctxbudget::cli::run(Cli::try_parse_from(argv)?).await
}

/// Runs the real `ctxbudget` binary against `redis` (see [`run_binary`]).
pub(crate) fn ctl_binary(redis: &RedisServer, args: &[&str]) -> (bool, String, String) {
    ctl_binary_at(&["--redis-url".into(), redis.url()], args)
}

/// [`ctl_binary`] against the store `store` names (`Harness::store_args`).
pub(crate) fn ctl_binary_at(store: &[String], args: &[&str]) -> (bool, String, String) {
    let mut argv = args.to_vec();
    argv.extend(store.iter().map(String::as_str));
    argv.extend_from_slice(&["--actor", "test-operator"]);
    run_binary(&argv)
}

/// Runs the real `ctxbudget` binary: whether it succeeded, and its standard
/// output and error.
fn run_binary(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
        .args(args)
        .env_remove("CTXBUDGET_REDIS_URL")
        .output()
        .expect("the ctxbudget binary runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// [`ctl_binary`] that must succeed; its standard output.
pub(crate) fn ctl_ok(redis: &RedisServer, args: &[&str]) -> String {
    let (ok, stdout, stderr) = ctl_binary(redis, args);
    assert!(ok, "ctxbudget {args:?} failed:\n{stdout}{stderr}");
    stdout
}

pub(crate) fn document(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

pub(crate) fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ctxbudget-ops-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn status(c: &mut Client, tenant: &str, user: &str, tier: &str) -> pb::GetStatusResponse {
    c.get_status(pb::GetStatusRequest {
        tenant_id: tenant.into(),
        user_id: user.into(),
        tier: tier.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

async fn user_request_limit(c: &mut Client, tenant: &str, user: &str, tier: &str) -> u64 {
    let s = status(c, tenant, user, tier).await;
    limit(&s.limits, Level::User, Dimension::Requests, 86_400).limit
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_a_limit_reaches_every_replica_within_a_second_without_errors() {
    let redis = RedisServer::start();
    let a = Harness::start_with(settings(TIER, Some(redis.url())), None).await;
    let b = Harness::start_with(settings(TIER, Some(redis.url())), None).await;
    let (stop, errors, calls) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    // A steady stream of requests on both replicas while the change happens.
    let streams: Vec<_> = [a.client.clone(), b.client.clone()]
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let (stop, errors, calls) = (stop.clone(), errors.clone(), calls.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let user = format!("stream-{i}-{}", n % 50);
                    match c
                        .check_and_reserve(reserve("acme", &user, "t", 10, 10))
                        .await
                    {
                        Ok(r) => {
                            let r = r.into_inner();
                            if r.allowed {
                                let refund = pb::RefundRequest {
                                    reservation_id: r.reservation_id,
                                };
                                if c.refund(refund).await.is_err() {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let dir = temp_dir("lower");
    let lower = document(
        &dir,
        "t.toml",
        "max_context_tokens = 100000\ndefault_max_output_tokens = 10\n\
         tenant = { requests = [{ limit = 100000, period = \"1d\" }] }\n\
         user = { requests = [{ limit = 2, period = \"1d\" }] }\n",
    );
    ctl(&redis, &["tiers", "set", "t", &lower])
        .await
        .expect("the change is accepted");
    tokio::time::sleep(Duration::from_millis(1100)).await;

    for mut c in [a.client.clone(), b.client.clone()] {
        assert_eq!(user_request_limit(&mut c, "acme", "fresh", "t").await, 2);
    }
    let (mut ca, mut cb) = (a.client.clone(), b.client.clone());
    let first = ca
        .check_and_reserve(reserve("acme", "new-user", "t", 1, 1))
        .await
        .unwrap();
    let second = cb
        .check_and_reserve(reserve("acme", "new-user", "t", 1, 1))
        .await
        .unwrap();
    let third = ca
        .check_and_reserve(reserve("acme", "new-user", "t", 1, 1))
        .await
        .unwrap();
    assert!(first.into_inner().allowed && second.into_inner().allowed);
    assert_eq!(third.into_inner().reason(), Reason::RpmExceeded);

    stop.store(true, Ordering::Relaxed);
    for s in streams {
        s.await.unwrap();
    }
    assert!(calls.load(Ordering::Relaxed) > 20, "the stream ran");
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "no request failed during the switch"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_is_caught_by_the_version_check() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(TIER, Some(redis.url())), None).await;
    assert_eq!(
        user_request_limit(&mut h.client, "acme", "u", "t").await,
        100
    );
    // Change the configuration the way a replica that missed the message sees
    // it: new document and version, no notification.
    let mut conn = redis.conn();
    let doc = r#"{"max_context_tokens":100000,"default_max_output_tokens":10,"tenant":{"requests":[{"limit":100000,"period":"1d"}]},"user":{"requests":[{"limit":7,"period":"1d"}]}}"#;
    let _: () = conn.hset("ctxb:cfg", "tier:t", doc).unwrap();
    let _: u64 = conn.hincr("ctxb:cfg", "version", 1).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(user_request_limit(&mut h.client, "acme", "u", "t").await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_changes_are_refused_and_nothing_is_written() {
    let redis = RedisServer::start();
    let _h = Harness::start_with(settings(TIER, Some(redis.url())), None).await;
    let mut conn = redis.conn();
    let before: std::collections::BTreeMap<String, String> = conn.hgetall("ctxb:cfg").unwrap();
    let dir = temp_dir("invalid");
    let head = "max_context_tokens = 1000\ndefault_max_output_tokens = 10\n";
    let cases = [
        (
            "negative",
            format!("{head}user = {{ requests = [{{ limit = -5, period = \"1m\" }}] }}\n"),
            "user.requests[0].limit",
        ),
        (
            "text",
            format!("{head}user = {{ requests = [{{ limit = \"many\", period = \"1m\" }}] }}\n"),
            "user.requests[0].limit",
        ),
        (
            "short period",
            format!("{head}user = {{ tokens = [{{ limit = 5, period = \"0s\" }}] }}\n"),
            "user.tokens[0].period",
        ),
        (
            "long period",
            format!("{head}user = {{ tokens = [{{ limit = 5, period = \"31d\" }}] }}\n"),
            "user.tokens[0].period",
        ),
        (
            "user above tenant",
            format!(
                "{head}tenant = {{ requests = [{{ limit = 5, period = \"1m\" }}] }}\n\
                 user = {{ requests = [{{ limit = 6, period = \"1m\" }}] }}\n"
            ),
            "user.requests[0].limit",
        ),
        ("unknown field", format!("{head}burst = 3\n"), "burst"),
    ];
    let override_cases = [
        (
            "[user]\ntokens = \"unlimted\"\n",
            "overrides.acme.user.tokens",
        ),
        ("[user]\ntokens = []\n", "overrides.acme.user.tokens"),
        (
            "[tenant]\nconcurrency = \"none\"\n",
            "overrides.acme.tenant.concurrency",
        ),
    ];
    for (text, field) in override_cases {
        let file = document(&dir, "bad-override.toml", text);
        let err = ctl(&redis, &["overrides", "set", "--tenant", "acme", &file])
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains(field), "{text}: {message}");
        assert!(message.contains("\"unlimited\""), "{text}: {message}");
        assert!(message.contains("nothing was written"), "{text}: {message}");
    }
    for (name, text, field) in cases {
        let file = document(&dir, "bad.toml", &text);
        let err = ctl(&redis, &["tiers", "set", "t", &file])
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains(field), "{name}: {message}");
        assert!(message.contains("nothing was written"), "{name}: {message}");
    }
    let err = ctl(
        &redis,
        &[
            "overrides",
            "set",
            "--tenant",
            "acme",
            &document(&dir, "o.toml", "tenant = { concurrency = 0 }\n"),
        ],
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("overrides.acme.tenant.concurrency"),
        "{err:#}"
    );
    let err = ctl(&redis, &["tiers", "delete", "t"]).await.unwrap_err();
    assert!(format!("{err:#}").contains("at least one tier"), "{err:#}");
    let after: std::collections::BTreeMap<String, String> = conn.hgetall("ctxb:cfg").unwrap();
    assert_eq!(before, after, "a refused change wrote something");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_win_over_tiers_and_deleting_one_restores_the_tier() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(TIER, Some(redis.url())), None).await;
    let dir = temp_dir("override");
    let deal = document(
        &dir,
        "bigco.toml",
        "tenant = { requests = [{ limit = 100000, period = \"1d\" }] }\nuser = { requests = [{ limit = 500, period = \"1d\" }] }\n",
    );
    ctl(&redis, &["overrides", "set", "--tenant", "bigco", &deal])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        user_request_limit(&mut h.client, "bigco", "u", "t").await,
        500
    );
    assert_eq!(
        user_request_limit(&mut h.client, "smallco", "u", "t").await,
        100
    );
    ctl(&redis, &["overrides", "delete", "--tenant", "bigco"])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        user_request_limit(&mut h.client, "bigco", "u", "t").await,
        100
    );

    let cfg = ConfigStore::connect(&Endpoint::Single(redis.url()), &Default::default(), "ctxb:")
        .await
        .unwrap();
    let history = cfg.history(10).await.unwrap();
    assert_eq!(history[0].field, "override:bigco");
    assert_eq!(
        (history[0].actor.as_str(), history[0].new.as_str()),
        ("test-operator", "")
    );
    assert!(history[1].new.contains("500") && history[1].old.is_empty());
    assert!(history[0].version > history[1].version);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_limit_keeps_what_was_used_and_debt() {
    let redis = RedisServer::start();
    let tier = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
user = { requests = [{ limit = 10, period = "30d" }], tokens = [{ limit = 1000, period = "30d" }] }
"#;
    let mut h = Harness::start_with(settings(tier, Some(redis.url())), None).await;
    for i in 0..5 {
        let r = h
            .client
            .check_and_reserve(reserve("acme", "u", "t", 10, 10))
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed);
        // The last commit overspends: 4 × 20 + 1,420 = 1,500 tokens against 1,000.
        let used = if i == 4 { 1420 } else { 20 };
        h.client
            .commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: used,
                completion_tokens: 0,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let dir = temp_dir("keep");
    let set = |requests: u64| {
        document(
            &dir,
            &format!("t{requests}.toml"),
            &format!(
                "max_context_tokens = 100000\ndefault_max_output_tokens = 10\n\
                 user = {{ requests = [{{ limit = {requests}, period = \"30d\" }}], tokens = [{{ limit = 2000, period = \"30d\" }}] }}\n"
            ),
        )
    };
    ctl(&redis, &["tiers", "set", "t", &set(8)]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let s = status(&mut h.client, "acme", "u", "t").await;
    let requests = limit(&s.limits, Level::User, Dimension::Requests, 30 * 86_400);
    assert_eq!(
        (requests.limit, requests.remaining),
        (8, 3),
        "what was used is kept (5 of 10: 3 of 8 left), not what was left"
    );
    let tokens = limit(&s.limits, Level::User, Dimension::Tokens, 30 * 86_400);
    assert_eq!(
        (tokens.limit, tokens.remaining),
        (2000, 500),
        "debt counts as used: 1,500 used of 2,000"
    );
    ctl(&redis, &["tiers", "set", "t", &set(3)]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let s = status(&mut h.client, "acme", "u", "t").await;
    let requests = limit(&s.limits, Level::User, Dimension::Requests, 30 * 86_400);
    assert_eq!(
        (requests.limit, requests.remaining),
        (3, -2),
        "more used than the new limit: the excess is owed, not forgiven"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_in_memory_mode() {
    let dir = temp_dir("sighup");
    let config = |limit: u64| {
        format!(
            "[tiers.t]\nmax_context_tokens = 1000\ndefault_max_output_tokens = 10\n\
             user = {{ requests = [{{ limit = {limit}, period = \"1d\" }}] }}\n"
        )
    };
    let file = document(&dir, "ctxbudget.toml", &config(5));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ctxbudget"))
        .args(["serve", "--listen", &listen, "--config", &file])
        .env_remove("CTXBUDGET_REDIS_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the binary starts");
    let mut client = support::connect(listen.parse().unwrap()).await;
    assert_eq!(user_request_limit(&mut client, "acme", "u", "t").await, 5);
    std::fs::write(&file, config(9)).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(user_request_limit(&mut client, "acme", "u", "t").await, 9);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

const FULL_TIER: &str = r#"
[tiers.t]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 1000, period = "1d" }], tokens = [{ limit = 1000000, period = "1d" }], concurrency = 50 }
user = { requests = [{ limit = 100, period = "1d" }], tokens = [{ limit = 10000, period = "1d" }], concurrency = 5 }
"#;

/// (level, dimension, period, limit) of every limit a reservation reports.
async fn reserved_limits(c: &mut Client, tenant: &str) -> Vec<(Level, Dimension, u64, u64)> {
    let r = c
        .check_and_reserve(reserve(tenant, "u", "t", 10, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");
    c.refund(pb::RefundRequest {
        reservation_id: r.reservation_id,
    })
    .await
    .unwrap();
    let mut limits: Vec<_> = r
        .limits
        .iter()
        .map(|l| (l.level(), l.dimension(), l.period_seconds, l.limit))
        .collect();
    limits.sort_by_key(|l| (l.0 as i32, l.1 as i32, l.2));
    limits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_changes_only_what_it_names_and_unlimited_removes_a_limit() {
    use Dimension::{Concurrency, Requests, Tokens};
    use Level::{Tenant, User};
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(FULL_TIER, Some(redis.url())), None).await;
    let dir = temp_dir("inherit");
    let user_tokens = "[user]\ntokens = [{ limit = 20000, period = \"1d\" }]\n";
    let deal = document(&dir, "bigco.toml", user_tokens);
    ctl(&redis, &["overrides", "set", "--tenant", "bigco", &deal])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let day = 86_400;
    assert_eq!(
        reserved_limits(&mut h.client, "bigco").await,
        vec![
            (Tenant, Requests, day, 1000),
            (Tenant, Tokens, day, 1_000_000),
            (Tenant, Concurrency, 0, 50),
            (User, Requests, day, 100),
            (User, Tokens, day, 20_000),
            (User, Concurrency, 0, 5),
        ],
        "only the user token limit is the override's; the rest is the tier's"
    );

    let unlimited = document(
        &dir,
        "bigco-unlimited.toml",
        &format!("{user_tokens}concurrency = \"unlimited\"\n"),
    );
    ctl(
        &redis,
        &["overrides", "set", "--tenant", "bigco", &unlimited],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        reserved_limits(&mut h.client, "bigco").await,
        vec![
            (Tenant, Requests, day, 1000),
            (Tenant, Tokens, day, 1_000_000),
            (Tenant, Concurrency, 0, 50),
            (User, Requests, day, 100),
            (User, Tokens, day, 20_000),
        ],
        "\"unlimited\" removes the user concurrency limit and nothing else"
    );

    // `overrides get` and `inspect` show the limits in force, not just the document.
    let tenant_line = "tenant  1000 req/1d, 1000000 tok/1d, 50 concurrent";
    let user_line = "user    100 req/1d, 20000 tok/1d\n";
    let get = ctl_ok(&redis, &["overrides", "get", "--tenant", "bigco"]);
    assert!(get.contains("on tier t:"), "{get}");
    assert!(
        get.contains(tenant_line) && get.contains(user_line),
        "{get}"
    );
    assert!(get.contains("concurrency = \"unlimited\""), "{get}");
    let inspect = ctl_ok(
        &redis,
        &["inspect", "--tenant", "bigco", "--user", "u", "--tier", "t"],
    );
    assert!(inspect.contains("limits in force"), "{inspect}");
    assert!(
        inspect.contains(tenant_line) && inspect.contains(user_line),
        "{inspect}"
    );
    let json = ctl_ok(
        &redis,
        &[
            "inspect", "--tenant", "bigco", "--user", "u", "--tier", "t", "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["limits"]["tenant"]["concurrency"], 50, "{json}");
    assert_eq!(
        report["limits"]["user"]["concurrency"],
        serde_json::Value::Null
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_answer_in_words_and_get_round_trips_through_set() {
    let redis = RedisServer::start();
    let _h = Harness::start_with(settings(FULL_TIER, Some(redis.url())), None).await;
    let dir = temp_dir("words");
    let three_rates = "max_context_tokens = 100000\ndefault_max_output_tokens = 10\n\
        [user]\ntokens = [{ limit = 100, period = \"1m\" }, { limit = 1000, period = \"1h\" }, \
        { limit = 10000, period = \"1d\" }]\n";
    let out = ctl_ok(
        &redis,
        &["tiers", "set", "t", &document(&dir, "t.toml", three_rates)],
    );
    assert_eq!(
        out,
        "updated tier t (configuration version 2); every replica applies it within a second\n"
    );
    let out = ctl_ok(
        &redis,
        &[
            "overrides",
            "set",
            "--tenant",
            "bigco",
            &document(&dir, "o.toml", "[user]\nconcurrency = 1\n"),
        ],
    );
    assert!(
        out.starts_with("created the override of tenant bigco (configuration version 3)"),
        "{out}"
    );

    let global = "requests = [{ limit = 100000, period = \"1m\" }]\nconcurrency = 1000\n";
    let out = ctl_ok(
        &redis,
        &["global", "set", &document(&dir, "g.toml", global)],
    );
    assert!(
        out.starts_with("updated the global limits (configuration version 4)"),
        "{out}"
    );

    // Every `get` prints a document its `set` takes back unchanged.
    let mut conn = redis.conn();
    let cases: [(&[&str], &[&str], &str); 3] = [
        (&["global", "get"], &["global", "set"], "global"),
        (&["tiers", "get", "t"], &["tiers", "set", "t"], "tier:t"),
        (
            &["overrides", "get", "--tenant", "bigco"],
            &["overrides", "set", "--tenant", "bigco"],
            "override:bigco",
        ),
    ];
    for (get, set, field) in cases {
        for json in [false, true] {
            let before: String = conn.hget("ctxb:cfg", field).unwrap();
            let mut get = get.to_vec();
            if json {
                if field.starts_with("override") {
                    continue; // its JSON is a report: the document is under "override"
                }
                get.push("--json");
            }
            let file = document(&dir, "round-trip", &ctl_ok(&redis, &get));
            let mut set = set.to_vec();
            set.push(&file);
            let out = ctl_ok(&redis, &set);
            assert!(out.starts_with("updated "), "{out}");
            let after: String = conn.hget("ctxb:cfg", field).unwrap();
            assert_eq!(before, after, "{get:?} then {set:?} changed the document");
        }
    }

    // History shows each change in full, however long.
    let history = ctl_ok(&redis, &["tiers", "history", "--limit", "20"]);
    let full = r#"user.tokens: [{"limit":10000,"period":"1d"}] → [{"limit":100,"period":"1m"},{"limit":1000,"period":"1h"},{"limit":10000,"period":"1d"}]"#;
    assert!(history.contains(full), "{history}");
    assert!(history.contains("tier:t  version 2 (updated)"), "{history}");
    assert!(history.contains("(no change)"), "{history}");
    let out = ctl_ok(&redis, &["overrides", "delete", "--tenant", "bigco"]);
    assert!(
        out.starts_with("deleted the override of tenant bigco"),
        "{out}"
    );
    for text in [&history, &out] {
        assert!(
            !text.contains("Tier(") && !text.contains("Override("),
            "{text}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_verb_exits_zero_only_when_the_service_is_serving() {
    let h = Harness::start(Backend::Memory, TIER).await;
    let addr = h.addr.to_string();
    let check = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_binary(&args)
        })
    };
    let health = |extra: &[&str]| {
        let mut args = vec!["health".to_string(), "--addr".into(), addr.clone()];
        args.extend(extra.iter().map(|a| a.to_string()));
        check(args)
    };
    let (ok, stdout, stderr) = health(&[]).await.unwrap();
    assert!(ok, "{stdout}{stderr}");
    assert_eq!(stdout, format!("{addr}: SERVING\n"));
    let (ok, _, _) = health(&["--service", "ctxbudget.v1.BudgetService"])
        .await
        .unwrap();
    assert!(ok, "the budget service is SERVING too");
    let (ok, _, stderr) = health(&["--service", "no.such.Service"]).await.unwrap();
    assert!(!ok && stderr.contains("not found"), "{stderr}");
    h.stop().await;
    let nobody = format!("127.0.0.1:{}", support::free_port());
    let args = ["health", "--addr", &nobody, "--timeout-ms", "500"];
    let (ok, _, stderr) = check(args.iter().map(|a| a.to_string()).collect())
        .await
        .unwrap();
    assert!(!ok && stderr.contains("cannot reach"), "{stderr}");
}
