//! `envoy.service.ratelimit.v3.RateLimitService`: Envoy's rate limit protocol
//! over the application's charges (docs/envoy.md). Each descriptor is mapped by
//! the live `[envoy]` map to a tenant's levels and decided on its own, in
//! order, as envoyproxy/ratelimit decides them:
//!
//! - request path, hits 0: a check (every request and token limit must have
//!   room; nothing is taken); hits N: N requests taken, all levels or none;
//! - response path (a `phase` = `response` entry; or a `response_keys` key
//!   and hits > 0), hits N: N tokens charged at every level, into debt,
//!   always OK;
//! - a domain not served, or a descriptor no key of which maps: OK, counted.
//!
//! Every descriptor is mapped and checked before the first is charged: a
//! malformed one is INVALID_ARGUMENT and changes nothing.
//!
//! - this file: the service and the request's validation.
//! - [`descriptor`]: the descriptor vocabulary, and the `[envoy]` map in force.
//! - `reply`: descriptor statuses and response headers from outcomes.

pub mod descriptor;
mod notes;
mod reply;

use crate::api::caller_of;
use crate::app::{App, AppError, Caller, span, timed};
use crate::domain::InvalidInput;
use crate::domain::limits::MAX_COUNT;
use crate::engine::ChargeInput;
use crate::envoy::service::ratelimit::v3 as rls;
use crate::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use crate::store::{Store, StoreError};
use crate::telemetry;
use descriptor::{Described, DescriptorMap, LiveMap, Mapping};
use reply::Answer;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;

/// The Envoy rate limit face of an [`App`].
pub struct EnvoyApi<S> {
    app: Arc<App<S>>,
    map: Arc<LiveMap>,
}

impl<S> EnvoyApi<S> {
    /// Serves `app`, mapping descriptors by `map` (replaced with the
    /// engine's limits when the configuration changes). Callers are
    /// authenticated in front of it, like the budget service's; a token bound
    /// to tenants may only charge those.
    pub fn new(app: Arc<App<S>>, map: Arc<LiveMap>) -> Self {
        EnvoyApi { app, map }
    }
}

/// One descriptor, validated: what it maps to and its hits.
struct Planned<'a> {
    mapping: Mapping<'a>,
    hits: u64,
}

fn invalid(message: String) -> AppError {
    InvalidInput::new("descriptors", message).into()
}

/// Maps and checks every descriptor of `req` (nothing is charged yet).
fn plan<'a>(
    map: &'a DescriptorMap,
    req: &'a rls::RateLimitRequest,
) -> Result<Vec<Planned<'a>>, AppError> {
    // The request's hits, for descriptors without their own: 0 means 1.
    let default_hits = u64::from(req.hits_addend.max(1));
    let mut out = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > MAX_ENTRIES {
            return Err(invalid(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                d.entries.len()
            )));
        }
        if d.is_negative_hits {
            return Err(invalid(format!(
                "descriptor {i} sets is_negative_hits: returning budget this way is not \
                 supported (budgets refill by themselves; a failed call charges nothing on \
                 the response path)"
            )));
        }
        let hits = d.hits_addend.unwrap_or(default_hits);
        if hits > MAX_COUNT {
            return Err(invalid(format!(
                "descriptor {i} has hits_addend {hits}; at most {MAX_COUNT}"
            )));
        }
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        let mapping = map.map(i, &entries)?;
        out.push(Planned { mapping, hits });
    }
    Ok(out)
}

/// The charge a mapped descriptor asks for.
fn charge_of(d: &Described<'_>, hits: u64) -> ChargeInput {
    let usage = d.path.charges_usage(hits);
    ChargeInput {
        tenant: d.tenant.clone(),
        user: d.user.clone(),
        session: d.session.clone(),
        tier: d.tier.to_owned(),
        model: d.model.to_owned(),
        requests: if usage { 0 } else { hits },
        tokens: if usage { hits } else { 0 },
        enforce: !usage,
    }
}

impl<S: Store> EnvoyApi<S> {
    #[expect(
        clippy::too_many_lines,
        reason = "one ShouldRateLimit from descriptors to answer, its steps in order"
    )]
    async fn decide(
        &self,
        caller: Option<&Caller>,
        req: &rls::RateLimitRequest,
    ) -> Result<rls::RateLimitResponse, AppError> {
        if req.domain.is_empty() {
            let e = InvalidInput::new(
                "domain",
                "is empty; set the rate limit filter's domain (docs/envoy.md)",
            );
            return Err(e.into());
        }
        if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
            let n = req.descriptors.len();
            return Err(invalid(format!(
                "has {n} descriptors; send 1 to {MAX_DESCRIPTORS}"
            )));
        }
        let engine = self.app.engine();
        let map = self.map.get();
        let map = map.as_ref();
        let mut answer = Answer::new(map.headers);
        // Until Redis's configuration is loaded the file's map stands in: a
        // descriptor it cannot place may be one the live map places, so it is
        // no OK to give.
        let unsure = || {
            AppError::from(StoreError::Unavailable(
                "the [envoy] map in Redis has not been loaded yet (Redis does not answer), and \
                 the configuration file's map does not place this request"
                    .into(),
            ))
        };
        if !map.serves(&req.domain) {
            if engine.is_provisional() {
                return Err(unsure());
            }
            notes::note_other_domain(&req.domain, &map.domain);
            for _ in &req.descriptors {
                telemetry::envoy_descriptor("other_domain", "none", None);
                answer.unmatched();
            }
            return Ok(answer.finish());
        }
        let planned = plan(map, req)?;
        for p in &planned {
            match &p.mapping {
                Mapping::Budget(d) => self.app.check_charge(caller, d.tenant.as_str(), d.tier)?,
                Mapping::Unmapped if engine.is_provisional() => return Err(unsure()),
                Mapping::Unmapped => {}
            }
        }
        for (i, p) in planned.iter().enumerate() {
            let d = match &p.mapping {
                Mapping::Unmapped => {
                    notes::note_unmapped(&req.descriptors[i]);
                    telemetry::envoy_descriptor("unmapped", "none", None);
                    answer.unmatched();
                    continue;
                }
                Mapping::Budget(d) => d,
            };
            let usage = d.path.charges_usage(p.hits);
            let out = self.app.charge(caller, charge_of(d, p.hits)).await?;
            crate::app::trace::charged(d.tenant.as_str(), d.tier, out.denial.as_ref());
            let outcome = match (&out.denial, usage) {
                (Some(_), _) => "over_limit",
                (None, true) => "charged",
                (None, false) => "ok",
            };
            telemetry::envoy_descriptor(outcome, d.tier, out.denial.as_ref());
            if usage {
                telemetry::envoy_charged(d.tier, p.hits);
            }
            answer.add(&out);
        }
        Ok(answer.finish())
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for EnvoyApi<S> {
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        let (_, extensions, req) = request.into_parts();
        let span = span("ShouldRateLimit", None);
        let decided = timed(
            "ShouldRateLimit",
            span,
            self.decide(caller_of(&extensions), &req),
        );
        decided.await.map(Response::new).map_err(Status::from)
    }
}
