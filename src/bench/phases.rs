//! The bench's phases: the optional Redis ceiling, then the main phase against
//! the service (remote or embedded) or the engine in-process, each run,
//! overspend-checked and costed in Redis CPU.

use super::ledger::Ledger;
use super::redis_info::commandstats;
use super::report::{PhaseReport, RedisCost};
use super::run::{self, Drive};
use super::target::{Api, Target};
use super::workload::Workload;
use super::{BenchArgs, BenchError, engines};
use crate::config::Settings;
use crate::store::redis::redact_url;
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
    pub async fn ceiling(&self, url: &str) -> Result<PhaseReport, BenchError> {
        let prefix = format!("ctxb:bench:{}:ceiling:", self.stamp);
        let engine = engines::redis_engine(self.settings, url, &prefix, self.connections).await?;
        let what = format!("EVALSHA straight to {} (no gRPC)", redact_url(url));
        self.measure("ceiling", what, Arc::new(Target::Redis(engine)), Some(url))
            .await
    }

    /// Sets up the main phase's target as the flags say.
    pub async fn main_phase(&self, args: &BenchArgs) -> Result<MainPhase, BenchError> {
        match Mode::of(args) {
            Mode::Target(url) => {
                let target = Target::grpc(&url, self.connections, self.api)
                    .await
                    .map_err(BenchError)?;
                Ok(MainPhase {
                    name: "service",
                    what: format!("gRPC to {url}{}", self.api_note()),
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

    /// A service in this process over Redis at `url` or the memory store.
    async fn embedded(&self, url: Option<String>) -> Result<MainPhase, BenchError> {
        let mut s = self.settings.clone();
        s.redis_url = url.clone();
        s.key_prefix = format!("ctxb:bench:{}:service:", self.stamp);
        s.connections = self.connections;
        let (addr, stop) = engines::embedded_server(s).await?;
        let endpoint = format!("http://{addr}");
        let target = Target::grpc(&endpoint, self.connections, self.api)
            .await
            .map_err(BenchError)?;
        let store = url
            .as_deref()
            .map_or("memory store".to_string(), redact_url);
        Ok(MainPhase {
            name: "service",
            what: format!(
                "gRPC to an in-process service on {addr} ({store}){}",
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
        }
    }

    /// Measures the main phase, then stops its embedded service; the report
    /// and the Redis the phase ran on, if any.
    pub async fn run_main(
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
            Some(url) => Some(commandstats(url).await?),
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
            (Some(url), Some(before)) => Some(redis_cost(before, commandstats(url).await?)),
            _ => None,
        };
        let checked = ledger.check(run.elapsed);
        Ok(PhaseReport::new(
            name,
            what,
            self.drive.duration.as_secs_f64(),
            &run,
            checked,
            cost,
        ))
    }
}

/// The Redis CPU between two `(calls, usec)` readings of `INFO commandstats`.
fn redis_cost((calls0, usec0): (u64, u64), (calls1, usec1): (u64, u64)) -> RedisCost {
    let calls = calls1.saturating_sub(calls0);
    RedisCost {
        calls,
        usec_per_call: (usec1.saturating_sub(usec0)) as f64 / calls.max(1) as f64,
    }
}
