//! `ctxbudget bench` end to end: a short run against an in-process service, and
//! a run with a Redis ceiling, each producing the table, JSON, chart and an
//! overspend check that finds nothing.

use crate::support;

use clap::Parser;
use ctxbudget::cli::{Cli, Command};
use support::RedisServer;

fn args(extra: &[&str]) -> ctxbudget::bench::BenchArgs {
    let mut argv = vec![
        "ctxbudget",
        "bench",
        "--duration",
        "1s",
        "--warmup",
        "0s",
        "--no-progress",
    ];
    argv.extend_from_slice(extra);
    match Cli::parse_from(argv).command {
        Command::Bench(args) => *args,
        _ => unreachable!("parsed a bench command"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reports_latency_decisions_and_no_overspend() {
    let dir = std::env::temp_dir().join(format!("ctxbudget-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("r.json"), dir.join("r.svg"));
    let a = args(&[
        "--concurrency",
        "8",
        "--upstream-ms",
        "20",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let report = ctxbudget::bench::run(a, "test".into())
        .await
        .expect("bench runs");
    let phase = &report.phases[0];
    assert!(phase.reserve_per_sec > 0.0);
    assert!(
        phase.rpcs.iter().any(|r| r.rpc == "Commit" && r.count > 0),
        "settles are measured"
    );
    assert!(phase.decisions.values().sum::<u64>() > 0);
    assert!(phase.errors.is_empty(), "{:?}", phase.errors);
    assert!(phase.buckets_checked > 0);
    assert!(phase.overspend.is_empty(), "{:?}", phase.overspend);
    // Built-in tiers are small: the default workload must hit them.
    assert!(
        phase.decisions.keys().any(|k| k != "allowed"),
        "{:?}",
        phase.decisions
    );
    let parsed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        parsed["phases"][0]["overspend"].as_array().map(Vec::len),
        Some(0)
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(
        chart.starts_with("<svg") && chart.contains("polyline"),
        "a chart was drawn"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// `--api ext_proc`: every call a Process stream, the prompt read from the
/// body and the usage from the streamed answer; the overspend check holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_through_the_external_processor_settles_every_stream() {
    let a = args(&[
        "--api",
        "ext_proc",
        "--concurrency",
        "8",
        "--upstream-ms",
        "20",
        "--prompt-median",
        "200",
        "--long-share",
        "0",
    ]);
    let report = ctxbudget::bench::run(a, "test".into())
        .await
        .expect("bench runs");
    let phase = &report.phases[0];
    assert!(
        phase.target.contains("ExternalProcessor"),
        "{}",
        phase.target
    );
    assert!(
        phase.rpcs.iter().any(|r| r.rpc == "Commit" && r.count > 0),
        "streams are settled"
    );
    assert!(phase.errors.is_empty(), "{:?}", phase.errors);
    assert!(phase.decisions.get("allowed").is_some_and(|n| *n > 0));
    assert!(phase.overspend.is_empty(), "{:?}", phase.overspend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ceiling_run_compares_and_calibrates_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let a = args(&[
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/config/bench.toml"),
        "--concurrency",
        "16",
        "--upstream-ms",
        "20",
        "--embedded",
        &url,
        "--ceiling",
        &url,
    ]);
    let report = ctxbudget::bench::run(a, "test".into())
        .await
        .expect("bench runs");
    assert_eq!(report.phases.len(), 2);
    assert_eq!(report.phases[0].name, "ceiling");
    assert!(report.ceiling_ratio.is_some_and(|r| r > 0.0));
    for p in &report.phases {
        assert!(p.overspend.is_empty(), "{}: {:?}", p.name, p.overspend);
        let redis = p.redis.as_ref().expect("Redis cost measured");
        assert!(redis.calls > 0 && redis.usec_per_call > 0.0);
    }
    let c = report.calibration.as_ref().expect("calibrated");
    assert!(c.reserve_usec > 0.0 && c.commit_usec > 0.0);
    assert!(c.shape.contains("3 levels"), "{}", c.shape);
    assert!(report.render().contains("service / ceiling throughput"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_redis_cluster_reports_each_master_and_the_global_key() {
    let cluster = support::cluster::RedisCluster::start(false);
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let spec = format!("redis-cluster://{}", nodes.join(","));
    let a = args(&["--concurrency", "8", "--embedded", &spec]);
    let report = ctxbudget::bench::run(a, "test".into())
        .await
        .expect("bench runs on a cluster");
    let phase = &report.phases[0];
    assert!(phase.reserve_per_sec > 0.0);
    assert!(phase.overspend.is_empty(), "{:?}", phase.overspend);
    let redis = phase.redis.as_ref().expect("the cluster's script CPU");
    assert_eq!(redis.masters.len(), 3, "{redis:?}");
    let shares: f64 = redis.masters.iter().map(|m| m.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{redis:?}");
    let per_reservation = redis
        .global_calls_per_reservation
        .expect("global-key calls");
    assert!(
        per_reservation > 0.0 && per_reservation < 1.0,
        "{per_reservation}"
    );
}
