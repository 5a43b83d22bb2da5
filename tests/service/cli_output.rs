//! What the operator commands print, as a shell sees it: a reader that goes
//! away early (`ctxbudget inspect … | head`) ends the command quietly, with
//! status 0 and nothing on stderr, for every command that prints.

use crate::support;

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
