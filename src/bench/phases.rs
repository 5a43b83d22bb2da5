//! The bench's phases: the optional Redis ceiling, then the main phase against
//! the service (remote or embedded) or the engine in-process, each run,
//! overspend-checked and costed in Redis CPU.

use super::ledger::Ledger;
use super::redis_info::{cluster_nodes, commandstats, masters_commandstats};
use super::report::{MasterCost, PhaseReport, RedisCost};
use super::run::{self, Drive};
use super::target::{Api, Target};
use super::workload::Workload;
use super::{BenchArgs, BenchError, engines};
use crate::config::Settings;
use crate::store::redis::redact_url;
use crate::telemetry::cluster_global_counts;
use std::sync::Arc;
use tokio::sync::oneshot;

/// What every phase of one bench run shares.
pub(super) struct Bench<'a> {
    /// Tiers and limits.
    pub settings: &'a Settings,
    /// Who calls with what.
    pub workload: Arc<Workload>,
    /// How hard and how long.
    pub drive: Drive,
    /// Distinguishes this run's keys from earlier runs'.
    pub stamp: u128,
    /// Connections to the target.
    pub connections: usize,
    /// The API a gRPC target is driven through.
    pub api: Api,
}

/// Where the main phase sends its load.
enum Mode {
    Target(String),
    Embedded(Option<String>),
    Direct(Option<String>),
}

impl Mode {
    fn of(args: &BenchArgs) -> Mode {
        match (&args.target, &args.embedded, &args.direct) {
            (Some(t), _, _) => Mode::Target(t.clone()),
            (_, _, Some(d)) => Mode::Direct(store_url(d)),
            (_, Some(e), _) => Mode::Embedded(store_url(e)),
            _ => Mode::Embedded(None),
        }
    }
}

/// `memory` is the memory store; anything else a Redis URL.
fn store_url(spec: &str) -> Option<String> {
    (spec != "memory").then(|| spec.to_string())
}

/// The main phase, ready to measure.
pub(super) struct MainPhase {
    name: &'static str,
    what: String,
    target: Target,
    /// The Redis it runs on, if any.
    url: Option<String>,
    /// Stops the embedded service, if there is one.
    server: Option<oneshot::Sender<()>>,
}

impl Bench<'_> {
    /// The ceiling: the same workload as EVALSHA straight to Redis at `url`.
    pub(super) async fn ceiling(&self, url: &str) -> Result<PhaseReport, BenchError> {
        if cluster_nodes(url).is_some() {
            return Err(BenchError(
                "--ceiling runs one Redis, not a cluster: name one master's URL".into(),
            ));
        }
        let prefix = format!("ctxb:bench:{}:ceiling:", self.stamp);
        let engine = engines::redis_engine(self.settings, url, &prefix, self.connections).await?;
        let what = format!("EVALSHA straight to {} (no gRPC)", redact_url(url));
        self.measure("ceiling", what, Arc::new(Target::Redis(engine)), Some(url))
            .await
    }

    /// Sets up the main phase's target as the flags say.
    pub(super) async fn main_phase(&self, args: &BenchArgs) -> Result<MainPhase, BenchError> {
        match Mode::of(args) {
            Mode::Target(url) => {
                let target = Target::grpc(&url, self.connections, self.api)
                    .await
                    .map_err(BenchError)?;
                let face = if self.api == Api::Http {
                    "HTTP"
                } else {
                    "gRPC"
                };
                Ok(MainPhase {
                    name: "service",
                    what: format!("{face} to {url}{}", self.api_note()),
                    target,
                    url: None,
                    server: None,
                })
            }
            Mode::Direct(url) => self.direct(url).await,
            Mode::Embedded(url) => self.embedded(url).await,
        }
    }

    /// The engine in this process, over Redis at `url` or the memory store.
    async fn direct(&self, url: Option<String>) -> Result<MainPhase, BenchError> {
        if url.as_deref().and_then(cluster_nodes).is_some() {
            return Err(BenchError(
                "--direct runs one Redis; drive a Redis Cluster with --embedded \
                 redis-cluster://host:port,…"
                    .into(),
            ));
        }
        let (what, target) = match &url {
            Some(u) => {
                let prefix = format!("ctxb:bench:{}:direct:", self.stamp);
                let e = engines::redis_engine(self.settings, u, &prefix, self.connections).await?;
                ("engine in-process over Redis (no gRPC)", Target::Redis(e))
            }
            None => (
                "engine in-process over the memory store (no gRPC)",
                Target::Memory(engines::memory_engine(self.settings)),
            ),
        };
        Ok(MainPhase {
            name: "direct",
            what: what.into(),
            target,
            url,
            server: None,
        })
    }

    /// A service in this process over Redis at `url` (a Redis Cluster for
    /// `redis-cluster://host:port,…`) or the memory store.
    async fn embedded(&self, url: Option<String>) -> Result<MainPhase, BenchError> {
        let mut s = self.settings.clone();
        match url.as_deref().and_then(cluster_nodes) {
            Some(nodes) => {
                s.cluster_nodes = nodes;
                s.redis_url = None;
            }
            None => s.redis_url = url.clone(),
        }
        s.key_prefix = format!("ctxb:bench:{}:service:", self.stamp);
        s.connections = self.connections;
        if self.api == Api::Http {
            s.http_listen = Some(engines::free_port().await?);
        }
        let http = s.http_listen;
        let (addr, stop) = engines::embedded_server(s).await?;
        let target = match http {
            Some(h) => Target::http(&format!("http://{h}"), self.connections),
            None => Target::grpc(&format!("http://{addr}"), self.connections, self.api).await,
        }
        .map_err(BenchError)?;
        let store = url
            .as_deref()
            .map_or("memory store".to_string(), redact_url);
        Ok(MainPhase {
            name: "service",
            what: format!(
                "{} to an in-process service on {} ({store}){}",
                if http.is_some() { "HTTP" } else { "gRPC" },
                http.unwrap_or(addr),
                self.api_note()
            ),
            target,
            url,
            server: Some(stop),
        })
    }

    /// What the phase's description adds for the API driven.
    fn api_note(&self) -> &'static str {
        match self.api {
            Api::Budget => "",
            Api::Envoy => {
                ", Envoy's ShouldRateLimit: request path as CheckAndReserve, response path as \
                 Commit"
            }
            Api::Http => ", the HTTP/JSON API: POST /v1/check-and-reserve, /v1/commit, /v1/refund",
            Api::ExtProc => {
                ", Envoy's ExternalProcessor: one Process stream per call, the prompt as text, \
                 the answer streamed with its usage"
            }
        }
    }

    /// Measures the main phase, then stops its embedded service; the report
    /// and the Redis the phase ran on, if any.
    pub(super) async fn run_main(
        &self,
        main: MainPhase,
    ) -> Result<(PhaseReport, Option<String>), BenchError> {
        let MainPhase {
            name,
            what,
            target,
            url,
            server,
        } = main;
        let report = self
            .measure(name, what, Arc::new(target), url.as_deref())
            .await?;
        if let Some(stop) = server {
            let _ = stop.send(());
        }
        Ok((report, url))
    }

    /// Runs one phase and reports it, with the Redis CPU it cost when `redis` is set.
    async fn measure(
        &self,
        name: &str,
        what: String,
        target: Arc<Target>,
        redis: Option<&str>,
    ) -> Result<PhaseReport, BenchError> {
        let mut ledger = Ledger::new(&self.settings.limits, &self.workload.tiers);
        if self.api == Api::Envoy {
            ledger = ledger.requests_only();
        }
        let ledger = Arc::new(ledger);
        let before = match redis {
            Some(url) => Some(Reading::take(url).await?),
            None => None,
        };
        let run = run::phase(
            name,
            target,
            self.workload.clone(),
            ledger.clone(),
            self.drive,
        )
        .await;
        let cost = match (redis, before) {
            (Some(url), Some(before)) => Some(before.cost(&Reading::take(url).await?)),
            _ => None,
        };
        let checked = ledger.check(run.elapsed);
        Ok(PhaseReport::new(
            name,
            what,
            self.drive.duration.as_secs_f64(),
            &run,
            checked,
            ledger.debt_windows(),
            cost,
        ))
    }
}

/// What the bench reads of Redis before and after a phase: `INFO
/// commandstats` (of every master, on a cluster), and on a cluster the global
/// key's calls and the reservations that had a global limit.
struct Reading {
    /// (node, evalsha calls, usec): one entry for a single Redis.
    nodes: Vec<(String, u64, u64)>,
    /// On a cluster: this process's [`cluster_global_counts`].
    global: Option<(u64, u64)>,
}

impl Reading {
    async fn take(spec: &str) -> Result<Reading, BenchError> {
        Ok(match cluster_nodes(spec) {
            Some(nodes) => Reading {
                nodes: masters_commandstats(&nodes).await?,
                global: Some(cluster_global_counts()),
            },
            None => {
                let (calls, usec) = commandstats(spec).await?;
                Reading {
                    nodes: vec![(redact_url(spec), calls, usec)],
                    global: None,
                }
            }
        })
    }

    /// The Redis CPU between this reading and `after`.
    fn cost(&self, after: &Reading) -> RedisCost {
        let mut masters: Vec<MasterCost> = after
            .nodes
            .iter()
            .map(|(node, calls, usec)| {
                let (c0, u0) = self
                    .nodes
                    .iter()
                    .find(|(n, _, _)| n == node)
                    .map_or((0, 0), |(_, c, u)| (*c, *u));
                MasterCost {
                    node: node.clone(),
                    calls: calls.saturating_sub(c0),
                    usec: usec.saturating_sub(u0),
                    share: 0.0,
                }
            })
            .collect();
        let calls: u64 = masters.iter().map(|m| m.calls).sum();
        let usec: u64 = masters.iter().map(|m| m.usec).sum();
        for m in &mut masters {
            m.share = m.usec as f64 / usec.max(1) as f64;
        }
        let global_calls_per_reservation = match (self.global, after.global) {
            (Some((r0, g0)), Some((r1, g1))) => {
                Some((g1 - g0) as f64 / (r1.saturating_sub(r0)).max(1) as f64)
            }
            _ => None,
        };
        RedisCost {
            calls,
            usec_per_call: usec as f64 / calls.max(1) as f64,
            masters: match self.global {
                Some(_) => masters,
                None => Vec::new(),
            },
            global_calls_per_reservation,
        }
    }
}
