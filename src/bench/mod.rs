//! `ctxbudget bench`: a load generator for the gRPC API, with a Redis ceiling to
//! compare against and an overspend check in every run.
//!
//! - [`workload`]: who calls, how big the prompts are, how long upstream takes.
//! - [`target`]: the service over gRPC, or an engine over a store in-process.
//! - [`run`]: closed- and open-loop drivers, latency histograms, progress.
//! - [`ledger`]: what was granted per bucket, checked against the limits.
//! - [`report`], [`plot`]: the table, JSON and the SVG chart.

pub mod ledger;
pub mod plot;
pub mod report;
pub mod run;
pub mod target;
pub mod workload;

use crate::config::{self, Flags, Settings};
use crate::engine::Engine;
use crate::server;
use crate::store::keys::Keys;
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisSettings, RedisStore, redact_url};
use ledger::Ledger;
use report::{BenchReport, Calibration, PhaseReport, RedisCost};
use run::Drive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use target::Target;
use workload::{Workload, WorkloadArgs};

/// `ctxbudget bench` flags.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Drive a running service, e.g. http://127.0.0.1:50051.
    #[arg(long, conflicts_with_all = ["embedded", "direct"])]
    pub target: Option<String>,
    /// Start a service in this process: `memory` or a Redis URL (the default is
    /// `--embedded memory`).
    #[arg(long, conflicts_with = "direct")]
    pub embedded: Option<String>,
    /// Call the engine in this process, without gRPC: `memory` or a Redis URL.
    #[arg(long)]
    pub direct: Option<String>,
    /// First run the same workload straight against this Redis (one EVALSHA per
    /// call, no gRPC, same concurrency and keys), then the service, and report
    /// the ratio.
    #[arg(long)]
    pub ceiling: Option<String>,
    /// Closed loop: reservations in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: CheckAndReserve calls per second, latency measured from each
    /// call's intended send time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Measured time, e.g. 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured time first.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Configuration with the tiers to use (default: the built-in tiers).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// gRPC connections from the bench, and Redis connections of an in-process store.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Also write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw the latency-percentile chart as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No live progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

/// Parses `10s`, `2m`, `500ms`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s, 2m"));
    }
    config::parse_period(text).map(Duration::from_secs)
}

/// The bench could not run.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError(e.to_string())
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Where the main phase sends its load.
enum Mode {
    Target(String),
    Embedded(Option<String>),
    Direct(Option<String>),
}

fn store_url(spec: &str) -> Option<String> {
    (spec != "memory").then(|| spec.to_string())
}

/// Runs the bench and returns its report (already printed).
pub async fn run(args: BenchArgs, command: String) -> Result<BenchReport, BenchError> {
    let settings = config::load(args.config.as_deref(), Flags::default()).map_err(err)?;
    let workload = Workload::new(args.workload.clone()).map_err(err)?;
    for t in &workload.tiers {
        if settings.limits.tier(t).is_none() {
            return Err(BenchError(format!(
                "--tier-mix names tier {t:?}, which the configuration lacks (it has: {})",
                settings.limits.tier_names()
            )));
        }
    }
    let workload = Arc::new(workload);
    let mode = match (&args.target, &args.embedded, &args.direct) {
        (Some(t), _, _) => Mode::Target(t.clone()),
        (_, _, Some(d)) => Mode::Direct(store_url(d)),
        (_, Some(e), _) => Mode::Embedded(store_url(e)),
        _ => Mode::Embedded(None),
    };
    let drive = Drive {
        concurrency: args.concurrency,
        rate: args.rate,
        duration: args.duration,
        warmup: args.warmup,
        progress: !args.no_progress,
    };
    let stamp = unix_ms();
    let mut phases = Vec::new();
    let mut redis_seen = args.ceiling.clone();

    if let Some(url) = &args.ceiling {
        let prefix = format!("ctxb:bench:{stamp}:ceiling:");
        let engine = redis_engine(&settings, url, &prefix, args.connections).await?;
        let target = Arc::new(Target::Redis(engine));
        let what = format!(
            "EVALSHA straight to {} (no gRPC)",
            crate::store::redis::redact_url(url)
        );
        phases.push(
            measure(
                "ceiling",
                what,
                target,
                &workload,
                &settings,
                drive,
                Some(url),
            )
            .await?,
        );
    }

    let (name, what, target, url, server) = match mode {
        Mode::Target(url) => {
            let t = Target::grpc(&url, args.connections)
                .await
                .map_err(BenchError)?;
            ("service", format!("gRPC to {url}"), t, None, None)
        }
        Mode::Direct(url) => {
            let prefix = format!("ctxb:bench:{stamp}:direct:");
            match &url {
                Some(u) => {
                    let e = redis_engine(&settings, u, &prefix, args.connections).await?;
                    (
                        "direct",
                        "engine in-process over Redis (no gRPC)".into(),
                        Target::Redis(e),
                        url,
                        None,
                    )
                }
                None => {
                    let e = memory_engine(&settings);
                    (
                        "direct",
                        "engine in-process over the memory store (no gRPC)".into(),
                        Target::Memory(e),
                        None,
                        None,
                    )
                }
            }
        }
        Mode::Embedded(url) => {
            let mut s = settings.clone();
            s.redis_url = url.clone();
            s.key_prefix = format!("ctxb:bench:{stamp}:service:");
            s.connections = args.connections;
            let (addr, stop) = embedded_server(s).await?;
            let endpoint = format!("http://{addr}");
            let t = Target::grpc(&endpoint, args.connections)
                .await
                .map_err(BenchError)?;
            let store = url
                .as_deref()
                .map_or("memory store".to_string(), crate::store::redis::redact_url);
            (
                "service",
                format!("gRPC to an in-process service on {addr} ({store})"),
                t,
                url,
                Some(stop),
            )
        }
    };
    phases.push(
        measure(
            name,
            what,
            Arc::new(target),
            &workload,
            &settings,
            drive,
            url.as_deref(),
        )
        .await?,
    );
    if let Some(stop) = server {
        let _ = stop.send(());
    }
    if url.is_some() {
        redis_seen = redis_seen.or(url);
    }

    let calibration = match &redis_seen {
        Some(url) => Some(calibrate(&settings, url, stamp).await?),
        None => None,
    };
    let ceiling_ratio = (phases.len() == 2 && phases[0].reserve_per_sec > 0.0)
        .then(|| phases[1].reserve_per_sec / phases[0].reserve_per_sec);
    let report = BenchReport {
        command,
        machine: machine(redis_seen.as_deref()).await,
        phases,
        ceiling_ratio,
        calibration,
    };
    print!("{}", report.render());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(err)?;
        std::fs::write(path, json).map_err(|e| BenchError(format!("{}: {e}", path.display())))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&report))
            .map_err(|e| BenchError(format!("{}: {e}", path.display())))?;
    }
    Ok(report)
}

/// Runs one phase and reports it, with the Redis CPU it cost when `redis` is set.
async fn measure(
    name: &str,
    what: String,
    target: Arc<Target>,
    workload: &Arc<Workload>,
    settings: &Settings,
    drive: Drive,
    redis: Option<&str>,
) -> Result<PhaseReport, BenchError> {
    let ledger = Arc::new(Ledger::new(&settings.limits, &workload.tiers));
    let before = match redis {
        Some(url) => Some(commandstats(url).await?),
        None => None,
    };
    let run = run::phase(name, target, workload.clone(), ledger.clone(), drive).await;
    let cost = match (redis, before) {
        (Some(url), Some((calls0, usec0))) => {
            let (calls1, usec1) = commandstats(url).await?;
            let calls = calls1.saturating_sub(calls0);
            Some(RedisCost {
                calls,
                usec_per_call: (usec1.saturating_sub(usec0)) as f64 / calls.max(1) as f64,
            })
        }
        _ => None,
    };
    let checked = ledger.check(run.elapsed);
    Ok(PhaseReport::new(
        name,
        what,
        drive.duration.as_secs_f64(),
        &run,
        checked,
        cost,
    ))
}

fn memory_engine(settings: &Settings) -> Arc<Engine<MemoryStore>> {
    let keys = Keys::new(&settings.key_prefix).expect("validated prefix");
    let store = MemoryStore::new(keys, settings.retention);
    let engine = Arc::new(server::engine(store, settings));
    // Detached: they end with the bench's runtime.
    drop(server::engine_tasks(&engine));
    engine
}

async fn redis_engine(
    settings: &Settings,
    url: &str,
    prefix: &str,
    connections: usize,
) -> Result<Arc<Engine<RedisStore>>, BenchError> {
    let redis = RedisSettings {
        url: url.to_string(),
        pool: settings.pool,
        connections,
        timeout: settings.store_timeout.max(Duration::from_secs(2)),
        tls: settings.redis_tls.clone(),
    };
    let keys = Keys::new(prefix).map_err(BenchError)?;
    let store = RedisStore::connect(&redis, keys, settings.retention)
        .await
        .map_err(err)?;
    if !store.reachable() {
        return Err(BenchError(format!(
            "{} does not answer; start Redis first",
            redact_url(url)
        )));
    }
    let engine = Arc::new(server::engine(store, settings));
    // Detached: they end with the bench's runtime.
    drop(server::engine_tasks(&engine));
    Ok(engine)
}

async fn embedded_server(
    settings: Settings,
) -> Result<(std::net::SocketAddr, tokio::sync::oneshot::Sender<()>), BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    tokio::spawn(async move {
        let result = server::run(settings, listener, async {
            let _ = rx.await;
        })
        .await;
        let _ = ready_tx.send(result.map_err(|e| e.to_string()));
    });
    // Wait until it serves (health SERVING) or reports why it could not start.
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut ready_rx = ready_rx;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(result) = ready_rx.try_recv() {
            let why = result.err().unwrap_or_else(|| "it stopped".into());
            return Err(BenchError(format!(
                "the embedded service did not start: {why}"
            )));
        }
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(err)?;
        if let Ok(channel) = endpoint.connect().await {
            let check = HealthClient::new(channel)
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await;
            if check.is_ok_and(|r| r.get_ref().status() == ServingStatus::Serving) {
                return Ok((addr, tx));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(BenchError(
                "the embedded service did not become ready in 15 s".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// (calls, usec) of `evalsha` from `INFO commandstats`.
async fn commandstats(url: &str) -> Result<(u64, u64), BenchError> {
    let client = redis::Client::open(url).map_err(err)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(err)?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .map_err(err)?;
    Ok(parse_evalsha(&info))
}

fn parse_evalsha(info: &str) -> (u64, u64) {
    let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")) else {
        return (0, 0);
    };
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls"), field("usec"))
}

/// Redis CPU per CheckAndReserve and per Commit, measured apart: 1,000
/// reservations spread over 100 users of 10 tenants on the most limited tier,
/// then 1,000 commits.
async fn calibrate(settings: &Settings, url: &str, stamp: u128) -> Result<Calibration, BenchError> {
    use crate::domain::{TenantId, UserId};
    use crate::engine::{PromptInput, ReserveInput};
    let tier = ["enterprise", "pro", "free"]
        .into_iter()
        .find(|t| settings.limits.tier(t).is_some())
        .map(str::to_string)
        .or_else(|| settings.limits.tiers.keys().next().cloned())
        .ok_or_else(|| BenchError("no tier to calibrate with".into()))?;
    let prefix = format!("ctxb:bench:{stamp}:calibration:");
    let engine = redis_engine(settings, url, &prefix, 4).await?;
    let levels = crate::domain::plan::levels(
        &settings.limits,
        settings.limits.tier(&tier).map(|t| t.as_ref()),
        true,
        false,
    );
    let buckets: usize = levels.iter().map(|l| l.buckets.len()).sum();
    let slots = levels.iter().filter(|l| l.concurrency.is_some()).count();
    const CALLS: u64 = 1000;
    // 64 calls at a time: Redis sees them back to back, as under load (one call
    // at a time would also measure a cold Redis waking up for each).
    let request = |i: u64| -> Result<ReserveInput, BenchError> {
        Ok(ReserveInput {
            tenant: TenantId::parse(&format!("c{}", i % 10)).map_err(err)?,
            user: Some(UserId::parse(&format!("u{}", i % 100)).map_err(err)?),
            tier: tier.clone(),
            model: "calibration".into(),
            prompt: PromptInput::Tokens(1000),
            max_output_tokens: 500,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
        })
    };
    // Warm the keys first, as a running service has them.
    for i in 0..100 {
        if let Some(id) = engine
            .reserve(request(i)?)
            .await
            .map_err(err)?
            .reservation_id
        {
            engine.refund(&id).await.map_err(err)?;
        }
    }
    // Three rounds; the median of each script's cost, so one noisy round (this
    // machine is shared) does not decide the figure.
    let (mut reserve, mut commit) = (Vec::new(), Vec::new());
    let mut allowed = 0;
    for _round in 0..3 {
        let (c0, u0) = commandstats(url).await?;
        let mut ids = Vec::with_capacity(CALLS as usize);
        for chunk in (0..CALLS).collect::<Vec<_>>().chunks(64) {
            let calls = chunk.iter().map(|&i| {
                let engine = engine.clone();
                let req = request(i);
                async move { engine.reserve(req?).await.map_err(err) }
            });
            for out in futures_util::future::join_all(calls).await {
                if let Some(id) = out?.reservation_id {
                    ids.push(id);
                }
            }
        }
        let (c1, u1) = commandstats(url).await?;
        for chunk in ids.chunks(64) {
            let calls = chunk.iter().map(|id| engine.commit(id, 1000, 300));
            for out in futures_util::future::join_all(calls).await {
                out.map_err(err)?;
            }
        }
        let (c2, u2) = commandstats(url).await?;
        let per = |u: u64, c: u64| u as f64 / c.max(1) as f64;
        reserve.push(per(u1 - u0, c1 - c0));
        commit.push(per(u2 - u1, c2 - c1));
        allowed = ids.len();
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Calibration {
        calls: CALLS,
        reserve_usec: median(reserve),
        commit_usec: median(commit),
        shape: format!(
            "tier {tier}: {} levels, {buckets} buckets, {slots} concurrency limits; {allowed} of {CALLS} allowed; median of 3 rounds",
            levels.len()
        ),
    })
}

async fn machine(redis: Option<&str>) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mut facts = format!("{cores} cores, {cpu}");
    if let Some(url) = redis
        && let Ok(client) = redis::Client::open(url)
        && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        && let Ok(info) = redis::cmd("INFO")
            .arg("server")
            .query_async::<String>(&mut conn)
            .await
        && let Some(v) = info.lines().find_map(|l| l.strip_prefix("redis_version:"))
    {
        facts.push_str(&format!(", Redis {}", v.trim()));
    }
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_commandstats_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        let info = "# Commandstats\r\ncmdstat_get:calls=1,usec=2\r\ncmdstat_evalsha:calls=10,usec=300,usec_per_call=30.00\r\n";
        assert_eq!(parse_evalsha(info), (10, 300));
    }
}
