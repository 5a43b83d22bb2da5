//! Charges with no reservation behind them — what Envoy's rate limit protocol
//! asks: a check or a count of requests before a request goes upstream
//! (enforced), and the tokens its response used (forced, into debt). Plans
//! the levels of the tenant's tier without their concurrency limits (the
//! protocol has no release call), checks the quota in shadow, and answers
//! from the store or, when it fails, by the failure policy.

use super::reply::jitter;
use super::{Engine, EngineError};
use crate::domain::bucket::BucketSpec;
use crate::domain::budget::{ChargePlan, ChargeReply};
use crate::domain::decision::{self, LimitState};
use crate::domain::plan::{self, LevelPlan};
use crate::domain::{Denial, SessionId, ShadowLimits, TenantId, UserId};
use crate::store::Store;
use crate::telemetry;

/// A charge, fields validated.
#[derive(Clone, Debug)]
pub struct ChargeInput {
    /// The customer.
    pub tenant: TenantId,
    /// The user, if user-level limits apply.
    pub user: Option<UserId>,
    /// The session, if session-level limits apply.
    pub session: Option<SessionId>,
    /// The tier name.
    pub tier: String,
    /// The model ('' for none): adds its group's limits.
    pub model: String,
    /// Requests to take (0 with `enforce`: a check).
    pub requests: u64,
    /// Tokens to take.
    pub tokens: u64,
    /// Deny unless every limit has room (the request path); else take the
    /// cost whatever is left (usage already spent).
    pub enforce: bool,
}

/// What a charge decided.
#[derive(Clone, Debug, PartialEq)]
pub struct ChargeOutcome {
    /// `None` when allowed (a forced charge always is).
    pub denial: Option<Denial>,
    /// Every limit that applied, after the charge.
    pub limits: Vec<LimitState>,
    /// What the quota in shadow would have denied, if anything.
    pub shadow_denial: Option<Denial>,
    /// The quota in shadow's limits after its charge (empty when it was not
    /// charged): what a rule under trial reports where no enforced limit does.
    pub shadow_limits: Vec<LimitState>,
    /// Decided without the store (its failure policy applied).
    pub degraded: bool,
}

impl<S: Store> Engine<S> {
    /// Charges `input` at every level of the tenant's tier with a rate limit.
    pub async fn charge(&self, input: ChargeInput) -> Result<ChargeOutcome, EngineError> {
        let limits = self.limits();
        let tier = self.resolve_tier(&limits, &input.tier, input.tenant.as_str())?;
        // A blocked scope is refused on the request path; usage already spent
        // (the response path) is still charged.
        let user = input.user.as_ref().map(UserId::as_str);
        if input.enforce
            && let Some(denial) = super::blocked(&limits, input.tenant.as_str(), user)
        {
            return Ok(ChargeOutcome {
                denial: Some(denial),
                limits: Vec::new(),
                shadow_denial: None,
                shadow_limits: Vec::new(),
                degraded: false,
            });
        }
        let group = limits.group_of(&input.model);
        let now_us = self.store().now_us();
        let scope = plan::Scope {
            tier: Some(&tier),
            group,
            has_user: input.user.is_some(),
            has_session: input.session.is_some(),
            now_us,
        };
        let levels = rate_levels(plan::levels(&limits, scope, false));
        let charge = ChargePlan {
            tenant: input.tenant,
            user: input.user,
            session: input.session,
            levels,
            requests: input.requests,
            tokens: input.tokens,
            enforce: input.enforce,
        };
        let mut out = ChargeOutcome {
            denial: None,
            limits: Vec::new(),
            shadow_denial: None,
            shadow_limits: Vec::new(),
            degraded: false,
        };
        if let Some(denial) = too_large(&charge) {
            out.denial = Some(denial);
            return Ok(out);
        }
        // A tier whose limits are all in shadow has nothing enforced to
        // charge, but its quota in shadow is still charged and counted.
        let charge = match charge.levels.is_empty() {
            true => charge,
            false => self.charge_enforced(charge, &mut out).await?,
        };
        // The quota in shadow sees what the enforced one served.
        if let Some(shadow) = &tier.shadow
            && out.denial.is_none()
            && !out.degraded
        {
            (out.shadow_denial, out.shadow_limits) =
                self.shadow_charge(&charge, shadow, &tier.name, group).await;
        }
        Ok(out)
    }

    /// Charges the enforced levels of `charge` (on the store, or by the
    /// failure policy when it fails) into `out`; the plan as charged.
    async fn charge_enforced(
        &self,
        charge: ChargePlan,
        out: &mut ChargeOutcome,
    ) -> Result<ChargePlan, EngineError> {
        let (charge, reply, degraded) = self.budget.charge(charge).await?;
        out.degraded = degraded;
        match reply {
            ChargeReply::Charged { readings } => {
                out.limits = decision::limit_states(&charge.levels, &readings);
            }
            ChargeReply::Denied {
                readings,
                denied_mask,
            } => {
                let mut denial = decision::denial_by(
                    &charge.levels,
                    &readings,
                    denied_mask,
                    |b| room(&charge, b),
                    0.0,
                    self.settings.concurrency_retry_ms,
                );
                denial.retry_after_ms += jitter(self.settings.retry_jitter_ms);
                out.limits = decision::limit_states(&charge.levels, &readings);
                out.denial = Some(denial);
            }
        }
        Ok(charge)
    }

    /// Charges `charge` against the quota in shadow: its would-be denial and
    /// its limits after the charge. Store trouble here never touches the
    /// enforced decision.
    async fn shadow_charge(
        &self,
        charge: &ChargePlan,
        shadow: &ShadowLimits,
        tier: &str,
        group: Option<&std::sync::Arc<crate::domain::ModelGroup>>,
    ) -> (Option<Denial>, Vec<LimitState>) {
        let now = self.shadow.now_us();
        let has_user = charge.user.is_some();
        let levels = rate_levels(plan::shadow_levels(shadow, group, has_user, false, now));
        if levels.is_empty() {
            return (None, Vec::new());
        }
        let shadow_charge = ChargePlan {
            levels,
            ..charge.clone()
        };
        match self
            .budget
            .call("shadow_charge", self.shadow.charge(&shadow_charge))
            .await
        {
            Ok(ChargeReply::Denied {
                readings,
                denied_mask,
            }) => {
                let denial = decision::denial_by(
                    &shadow_charge.levels,
                    &readings,
                    denied_mask,
                    |b| room(&shadow_charge, b),
                    0.0,
                    self.settings.concurrency_retry_ms,
                );
                telemetry::shadow_denial(tier, &denial);
                let limits = decision::limit_states(&shadow_charge.levels, &readings);
                (Some(denial), limits)
            }
            Ok(ChargeReply::Charged { readings }) => (
                None,
                decision::limit_states(&shadow_charge.levels, &readings),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "shadow quota charge skipped");
                (None, Vec::new())
            }
        }
    }
}

/// What an enforced charge needs a bucket to hold: its cost, and at least one
/// unit (a retry waits until each denying bucket holds that again).
fn room(charge: &ChargePlan, b: &BucketSpec) -> u64 {
    charge.cost(b.dimension).max(1)
}

/// An enforced charge no bucket could ever hold (more requests than a limit):
/// refused before the store, since retrying cannot help.
fn too_large(charge: &ChargePlan) -> Option<Denial> {
    if !charge.enforce {
        return None;
    }
    charge.levels.iter().find_map(|lp| {
        let b = lp.buckets.iter().find(|b| room(charge, b) > b.limit)?;
        Some(Denial::request_too_large(
            b,
            lp.group_of(b),
            room(charge, b),
            0.0,
        ))
    })
}

/// The levels' rate limits alone: no concurrency, no entries without a bucket.
fn rate_levels(levels: Vec<LevelPlan>) -> Vec<LevelPlan> {
    levels
        .into_iter()
        .filter(|l| !l.buckets.is_empty())
        .map(|l| LevelPlan {
            concurrency: None,
            ..l
        })
        .collect()
}
