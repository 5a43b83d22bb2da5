//! The budget engine: takes validated requests, plans them against the current
//! limits, asks the store, and turns the store's readings into decisions. Knows
//! nothing of gRPC; `api/` translates to and from protobuf around it.

use crate::domain::decision::{self, LimitState};
use crate::domain::plan::{self, LeasePolicy, Prepared, ReserveRequest};
use crate::domain::{
    Denial, InvalidInput, Level, Limits, Reading, ReservationId, TenantId, UserId,
};
use crate::store::{
    RenewReply, ReserveReply, Scope, SettleReply, Settled, Settlement, Store, StoreError,
};
use crate::telemetry;
use std::sync::{Arc, RwLock};

/// What the engine needs besides the store and limits.
#[derive(Clone, Copy, Debug)]
pub struct EngineSettings {
    /// Lease lengths.
    pub leases: LeasePolicy,
    /// Random jitter added to every retry_after.
    pub retry_jitter_ms: u64,
    /// Longest retry_after suggested for a full concurrency limit.
    pub concurrency_retry_ms: u64,
}

/// A request the engine could not answer with a decision.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is malformed.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The reservation does not exist (any more).
    #[error("{0}")]
    NotFound(String),
    /// The request is well-formed but the state it refers to does not allow it.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The answer to CheckAndReserve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveOutcome {
    /// `None` when allowed; the refusal otherwise.
    pub denial: Option<Denial>,
    /// The reservation id when allowed.
    pub reservation_id: Option<String>,
    /// Prompt + output tokens reserved (or that would have been).
    pub reserved_tokens: u64,
    /// Output tokens included in `reserved_tokens`.
    pub max_output_tokens: u64,
    /// Every limit that applied.
    pub limits: Vec<LimitState>,
    /// When allowed: milliseconds until the lease lapses.
    pub lease_expires_in_ms: u64,
    /// An idempotency key returned an earlier reservation.
    pub replayed: bool,
}

/// What a settling call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Changed the reservation.
    Applied,
    /// Settled before; nothing changed.
    AlreadySettled,
    /// RenewLease on a lapsed lease.
    Expired,
}

/// Live leases at one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LevelLeases {
    /// The level.
    pub level: Level,
    /// Live leases.
    pub active: u64,
    /// The concurrency limit.
    pub limit: u64,
}

/// The answer to GetStatus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusOutcome {
    /// Every limit of the scope.
    pub limits: Vec<LimitState>,
    /// Live leases per level with a concurrency limit.
    pub leases: Vec<LevelLeases>,
}

/// Decides reservations over a store.
pub struct Engine<S> {
    store: S,
    limits: RwLock<Arc<Limits>>,
    settings: EngineSettings,
}

impl<S: Store> Engine<S> {
    /// An engine over `store` enforcing `limits`.
    pub fn new(store: S, limits: Arc<Limits>, settings: EngineSettings) -> Self {
        Engine {
            store,
            limits: RwLock::new(limits),
            settings,
        }
    }

    /// The store, for callers that describe or probe it.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<Limits> {
        self.limits
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the limits in force; calls in flight finish under the old ones.
    pub fn set_limits(&self, limits: Arc<Limits>) {
        *self.limits.write().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    /// CheckAndReserve.
    pub async fn reserve(&self, req: ReserveRequest) -> Result<ReserveOutcome, EngineError> {
        let limits = self.limits();
        let tier = req.tier.clone();
        let scope = (req.tenant.clone(), req.user.clone());
        let plan = match plan::prepare(req, &limits, &self.settings.leases)? {
            Prepared::Plan(plan) => plan,
            Prepared::Refused {
                denial,
                tokens,
                max_output_tokens,
            } => {
                telemetry::decision(&tier, Some(&denial), 0);
                // Retrying cannot help, but the caller still gets the limits to
                // build its headers from; without the store, it gets none.
                let levels = plan::levels(
                    &limits,
                    limits.tier(&tier).map(Arc::as_ref),
                    scope.1.is_some(),
                    false,
                );
                let status = Scope {
                    tenant: &scope.0,
                    user: scope.1.as_ref(),
                };
                let limits = match self.store.status(status, &levels).await {
                    Ok(readings) => decision::limit_states(&levels, &readings),
                    Err(_) => Vec::new(),
                };
                return Ok(ReserveOutcome {
                    denial: Some(denial),
                    reservation_id: None,
                    reserved_tokens: tokens,
                    max_output_tokens,
                    limits,
                    lease_expires_in_ms: 0,
                    replayed: false,
                });
            }
        };
        let reply = self.store.reserve(&plan).await?;
        let mut out = ReserveOutcome {
            denial: None,
            reservation_id: None,
            reserved_tokens: plan.tokens,
            max_output_tokens: plan.max_output_tokens,
            limits: Vec::new(),
            lease_expires_in_ms: plan.lease_ttl_ms,
            replayed: false,
        };
        match reply {
            ReserveReply::Allowed { readings } => {
                out.limits = decision::limit_states(&plan.levels, &readings);
                out.reservation_id = Some(plan.id.to_string());
            }
            ReserveReply::Denied {
                readings,
                denied_mask,
            } => {
                let mut denial = decision::denial(
                    &plan.levels,
                    &readings,
                    denied_mask,
                    plan.tokens,
                    self.settings.concurrency_retry_ms,
                );
                denial.retry_after_ms += self.jitter();
                out.limits = decision::limit_states(&plan.levels, &readings);
                out.denial = Some(denial);
                out.lease_expires_in_ms = 0;
            }
            ReserveReply::Replayed {
                nonce,
                tokens,
                lease_expires_in_ms,
                readings,
            } => {
                let id = plan.id.with_nonce_b64(&nonce).ok_or_else(|| {
                    StoreError::Protocol(format!("stored idempotency nonce {nonce:?} is malformed"))
                })?;
                out.limits = decision::limit_states(&plan.levels, &readings);
                out.reservation_id = Some(id.to_string());
                out.reserved_tokens = tokens;
                out.lease_expires_in_ms = lease_expires_in_ms;
                out.replayed = true;
            }
            ReserveReply::IdempotencySpent { settled } => {
                let what = if settled {
                    "was already committed or refunded"
                } else {
                    "has a lease that already lapsed (commit or refund it)"
                };
                return Err(EngineError::FailedPrecondition(format!(
                    "idempotency_key belongs to a reservation that {what}; a new request needs a new key"
                )));
            }
            ReserveReply::IdempotencyConflict => {
                return Err(InvalidInput::new(
                    "idempotency_key",
                    "was already used for a different request of this tenant; use a new key per \
                     logical request",
                )
                .into());
            }
        }
        let fresh_tokens = if out.replayed { 0 } else { out.reserved_tokens };
        telemetry::decision(&tier, out.denial.as_ref(), fresh_tokens);
        Ok(out)
    }

    /// The settlement of a reservation id: every level it touched, with the
    /// current limits of its tier (none, if the tier was removed since).
    fn settlement_levels(&self, id: &ReservationId) -> Vec<crate::domain::LevelPlan> {
        let limits = self.limits();
        plan::levels(
            &limits,
            limits.tier(&id.tier).map(Arc::as_ref),
            id.user.is_some(),
            true,
        )
    }

    /// Commit.
    pub async fn commit(
        &self,
        reservation_id: &str,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) -> Result<(Outcome, i64), EngineError> {
        let id = ReservationId::parse(reservation_id)?;
        let prompt = plan::check_tokens("prompt_tokens", prompt_tokens)?;
        let completion = plan::check_tokens("completion_tokens", completion_tokens)?;
        let levels = self.settlement_levels(&id);
        let s = Settlement {
            id: &id,
            levels: &levels,
        };
        let reply = self.store.commit(s, prompt + completion).await?;
        let (outcome, settled) = settle_outcome(reply, reservation_id)?;
        let delta = match settled {
            Settled::Committed(delta) => delta,
            Settled::Refunded(_) => 0,
        };
        if outcome == Outcome::Applied {
            telemetry::committed(&id.tier, prompt + completion, delta);
        }
        Ok((outcome, delta))
    }

    /// Refund.
    pub async fn refund(&self, reservation_id: &str) -> Result<(Outcome, u64), EngineError> {
        let id = ReservationId::parse(reservation_id)?;
        let levels = self.settlement_levels(&id);
        let s = Settlement {
            id: &id,
            levels: &levels,
        };
        let (outcome, settled) = settle_outcome(self.store.refund(s).await?, reservation_id)?;
        let refunded = match settled {
            Settled::Refunded(n) => n,
            Settled::Committed(_) => 0,
        };
        if outcome == Outcome::Applied {
            telemetry::refunded(&id.tier, refunded);
        }
        Ok((outcome, refunded))
    }

    /// RenewLease.
    pub async fn renew(
        &self,
        reservation_id: &str,
        lease_ttl_ms: Option<u64>,
    ) -> Result<(Outcome, u64), EngineError> {
        let id = ReservationId::parse(reservation_id)?;
        let ttl = self.settings.leases.ttl_ms("lease_ttl_ms", lease_ttl_ms)?;
        let levels = self.settlement_levels(&id);
        let s = Settlement {
            id: &id,
            levels: &levels,
        };
        match self.store.renew(s, ttl).await? {
            RenewReply::Renewed { expires_in_ms } => Ok((Outcome::Applied, expires_in_ms)),
            RenewReply::AlreadySettled => Ok((Outcome::AlreadySettled, 0)),
            RenewReply::Expired => Ok((Outcome::Expired, 0)),
            RenewReply::NotFound => Err(not_found(reservation_id)),
        }
    }

    /// GetStatus.
    pub async fn status(
        &self,
        tenant: &TenantId,
        user: Option<&UserId>,
        tier: &str,
    ) -> Result<StatusOutcome, EngineError> {
        let limits = self.limits();
        let tier = limits.tier(tier).ok_or_else(|| {
            InvalidInput::new(
                "tier",
                format!(
                    "unknown tier {tier:?}; known tiers: {}",
                    limits.tier_names()
                ),
            )
        })?;
        let levels = plan::levels(&limits, Some(tier), user.is_some(), false);
        let readings = self.store.status(Scope { tenant, user }, &levels).await?;
        let mut leases = Vec::new();
        let mut end = 0;
        for lp in &levels {
            end += lp.reading_count();
            if let Some(limit) = lp.concurrency
                && let Some(Reading::Concurrency { active, .. }) = readings.get(end - 1)
            {
                leases.push(LevelLeases {
                    level: lp.level,
                    active: *active,
                    limit,
                });
            }
        }
        Ok(StatusOutcome {
            limits: decision::limit_states(&levels, &readings),
            leases,
        })
    }

    fn jitter(&self) -> u64 {
        match self.settings.retry_jitter_ms {
            0 => 0,
            j => rand::random_range(0..=j),
        }
    }
}

fn settle_outcome(reply: SettleReply, id: &str) -> Result<(Outcome, Settled), EngineError> {
    match reply {
        SettleReply::Applied(s) => Ok((Outcome::Applied, s)),
        SettleReply::AlreadySettled(s) => Ok((Outcome::AlreadySettled, s)),
        SettleReply::NotFound => Err(not_found(id)),
    }
}

fn not_found(id: &str) -> EngineError {
    let shown: String = id.chars().take(80).collect();
    EngineError::NotFound(format!(
        "reservation {shown} not found: it was never made, or its record expired (records are \
         kept for the lease plus the retention period); nothing to settle"
    ))
}
