//! Redis CPU per CheckAndReserve and per Commit, measured apart from any load:
//! 1,000 reservations spread over 100 users of 10 tenants on the most limited
//! tier (each user in one session when the tier limits sessions), then 1,000
//! commits, in three rounds; the report takes each script's median.

use super::redis_info::commandstats;
use super::report::Calibration;
use super::{BenchError, engines, err};
use crate::config::Settings;
use crate::domain::plan::ReserveRequest;
use crate::domain::{Priority, PromptInput, ReservationId, SessionId, TenantId, UserId};
use crate::engine::{CommitRequest, Completion, Engine};
use crate::store::redis::RedisStore;
use std::sync::Arc;

/// Reservations (and commits) per round.
const CALLS: u64 = 1000;
/// Calls in flight at once: Redis sees them back to back, as under load (one
/// call at a time would also measure a cold Redis waking up for each).
const IN_FLIGHT: usize = 64;
/// Rounds; the median of each script's cost, so one noisy round (this machine
/// is shared) does not decide the figure.
const ROUNDS: usize = 3;

/// Measures the scripts' Redis CPU on `url`, under keys of their own.
/// The model the calibration's requests name: a model group matching it
/// (`[models.*] match = ["calibration"]`) adds its limits to the measured cost.
pub(super) const CALIBRATION_MODEL: &str = "calibration";

pub(super) async fn calibrate(
    settings: &Settings,
    url: &str,
    stamp: u128,
) -> Result<Calibration, BenchError> {
    let tier = calibration_tier(settings)?;
    let sessions = settings.limits.tier(&tier).is_some_and(|t| {
        !t.session.is_unlimited() || t.models.values().any(|m| !m.session.is_unlimited())
    });
    let prefix = format!("ctxb:bench:{stamp}:calibration:");
    let engine = engines::redis_engine(settings, url, &prefix, 4).await?;
    let scope = crate::domain::plan::Scope {
        tier: settings.limits.tier(&tier).map(|t| t.as_ref()),
        group: settings.limits.group_of(CALIBRATION_MODEL),
        has_user: true,
        has_session: sessions,
        now_us: crate::domain::Clock::now_us(&crate::domain::SystemClock),
    };
    let levels = crate::domain::plan::levels(&settings.limits, scope, false);
    let buckets: usize = levels.iter().map(|l| l.buckets.len()).sum();
    let slots = levels.iter().filter(|l| l.concurrency.is_some()).count();
    let calls = Calls {
        engine,
        tier,
        sessions,
    };
    calls.warm().await?;
    let (mut reserve, mut commit) = (Vec::new(), Vec::new());
    let mut allowed = 0;
    for _round in 0..ROUNDS {
        let round = calls.round(url).await?;
        reserve.push(round.reserve_usec);
        commit.push(round.commit_usec);
        allowed = round.allowed;
    }
    Ok(Calibration {
        calls: CALLS,
        reserve_usec: median(reserve),
        commit_usec: median(commit),
        shape: format!(
            "tier {}: {} levels, {buckets} buckets, {slots} concurrency limits; {allowed} of {CALLS} allowed; median of 3 rounds",
            calls.tier,
            levels.len()
        ),
    })
}

/// The most limited of the usual tiers the configuration has, or its first.
fn calibration_tier(settings: &Settings) -> Result<String, BenchError> {
    ["enterprise", "pro", "free"]
        .into_iter()
        .find(|t| settings.limits.tier(t).is_some())
        .map(str::to_string)
        .or_else(|| settings.limits.tiers.keys().next().cloned())
        .ok_or_else(|| BenchError("no tier to calibrate with".into()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// µs of Redis CPU per call in one round, and the reservations allowed.
struct Round {
    reserve_usec: f64,
    commit_usec: f64,
    allowed: usize,
}

/// The calibration's calls, on one tier.
struct Calls {
    engine: Arc<Engine<RedisStore>>,
    tier: String,
    /// Each user's calls are one session's.
    sessions: bool,
}

impl Calls {
    /// Reservation `i`: one of 100 users of 10 tenants (in one session each
    /// with `sessions`).
    fn request(&self, i: u64) -> Result<ReserveRequest, BenchError> {
        Ok(ReserveRequest {
            tenant: TenantId::parse(&format!("c{}", i % 10)).map_err(err)?,
            user: Some(UserId::parse(&format!("u{}", i % 100)).map_err(err)?),
            session: match self.sessions {
                true => Some(SessionId::parse(&format!("run{}", i % 100)).map_err(err)?),
                false => None,
            },
            tier: self.tier.clone(),
            model: CALIBRATION_MODEL.into(),
            fallbacks: Vec::new(),
            statuses: Default::default(),
            prompt: PromptInput::Tokens(1000),
            max_output_tokens: 500,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
            priority: Priority::Normal,
            declared: Default::default(),
        })
    }

    /// Touches every key once first, as a running service has them.
    async fn warm(&self) -> Result<(), BenchError> {
        for i in 0..100 {
            let reply = self.engine.reserve(self.request(i)?).await.map_err(err)?;
            if let Some(id) = reply.reservation_id {
                let id = ReservationId::parse(&id).map_err(err)?;
                self.engine.refund(&id).await.map_err(err)?;
            }
        }
        Ok(())
    }

    /// `CALLS` reservations, then a commit of each allowed one, each measured
    /// by `INFO commandstats` on `url`.
    async fn round(&self, url: &str) -> Result<Round, BenchError> {
        let (c0, u0) = commandstats(url).await?;
        let ids = self.reserve_all().await?;
        let (c1, u1) = commandstats(url).await?;
        self.commit_all(&ids).await?;
        let (c2, u2) = commandstats(url).await?;
        let per = |u: u64, c: u64| u as f64 / c.max(1) as f64;
        Ok(Round {
            reserve_usec: per(u1 - u0, c1 - c0),
            commit_usec: per(u2 - u1, c2 - c1),
            allowed: ids.len(),
        })
    }

    /// Reserves `CALLS` times, `IN_FLIGHT` at once; the allowed reservations.
    async fn reserve_all(&self) -> Result<Vec<String>, BenchError> {
        let mut ids = Vec::with_capacity(CALLS as usize);
        for chunk in (0..CALLS).collect::<Vec<_>>().chunks(IN_FLIGHT) {
            let calls = chunk.iter().map(|&i| {
                let engine = self.engine.clone();
                let req = self.request(i);
                async move { engine.reserve(req?).await.map_err(err) }
            });
            for out in futures_util::future::join_all(calls).await {
                if let Some(id) = out?.reservation_id {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// Commits each of `ids`, `IN_FLIGHT` at once.
    async fn commit_all(&self, ids: &[String]) -> Result<(), BenchError> {
        for chunk in ids.chunks(IN_FLIGHT) {
            let calls = chunk.iter().map(|id| async move {
                let req = CommitRequest {
                    id: ReservationId::parse(id).map_err(err)?,
                    prompt_tokens: 1000,
                    completion: Completion::Tokens(300),
                    cached_prompt_tokens: 0,
                    cache_write_prompt_tokens: 0,
                    cache_write_1h_prompt_tokens: 0,
                    reasoning_tokens: 0,
                    declared: Default::default(),
                };
                self.engine.commit(req).await.map_err(err)
            });
            for out in futures_util::future::join_all(calls).await {
                out?;
            }
        }
        Ok(())
    }
}
