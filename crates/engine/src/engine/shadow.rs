//! Quotas in shadow: a stricter quota an operator is rolling out is evaluated on
//! every request against its own buckets and leases (the shadow store), and a
//! would-be denial is reported — in the response, a metric and a log line — but
//! the request is decided and charged by the enforced quota alone. The shadow
//! buckets are charged only when the shadow quota would have allowed the request
//! and the request was actually served, so its counts match what enforcing it
//! would have done.

use super::Engine;
use crate::domain::budget::Usage;
use crate::domain::decision;
use crate::domain::plan::{self, ReservePlan};
use crate::domain::{Denial, ReservationId, ShadowLimits, Tier};
use crate::store::{ReserveReply, Settlement, Store};
use crate::telemetry;

/// What the shadow quota made of a request.
struct ShadowCheck {
    /// The denial the shadow quota would have given.
    denial: Option<Denial>,
    /// The shadow reservation was taken (to refund if the request is not served).
    taken: bool,
}

/// How a reservation is settled in shadow.
pub(super) enum ShadowSettle {
    Commit(Usage),
    Refund,
    Renew { ttl_ms: u64 },
}

impl<S: Store> Engine<S> {
    /// What the quota in shadow of `tier`, if it has one, says of `plan`
    /// (the plan whose answer the caller gets; `served`: the store made its
    /// reservation): checked while the store is healthy (in an outage it
    /// would only add its deadline to every call), and the shadow
    /// reservation given back when the request was not served.
    pub(super) async fn shadow_verdict(
        &self,
        plan: &ReservePlan,
        tier: &Tier,
        served: bool,
    ) -> Option<Denial> {
        let shadow = tier.shadow.as_ref()?;
        if !self.budget.healthy() {
            return None;
        }
        let check = self.shadow_check(plan, shadow, &tier.name).await;
        if check.taken && !served {
            self.shadow_settle(&plan.id, ShadowSettle::Refund).await;
        }
        check.denial
    }

    /// Evaluates `plan` against the quota in shadow. Store trouble here never
    /// touches the enforced decision: it is logged and the check skipped.
    async fn shadow_check(
        &self,
        plan: &ReservePlan,
        shadow: &ShadowLimits,
        tier: &str,
    ) -> ShadowCheck {
        let group = plan.model_group.as_ref();
        let now = self.shadow.now_us();
        let levels = plan::shadow_levels(shadow, group, plan.id.user.is_some(), false, now);
        let nothing = ShadowCheck {
            denial: None,
            taken: false,
        };
        if levels.is_empty() {
            return nothing;
        }
        let shadow_plan = plan.for_shadow(levels);
        match self
            .budget
            .call("shadow_reserve", self.shadow.reserve(&shadow_plan))
            .await
        {
            Ok(ReserveReply::Allowed { .. }) => ShadowCheck {
                denial: None,
                taken: true,
            },
            Ok(ReserveReply::Denied {
                readings,
                denied_mask,
                ..
            }) => {
                let denial = decision::denial(
                    &shadow_plan.levels,
                    &readings,
                    denied_mask,
                    shadow_plan.cost_with(shadow_plan.min_output_tokens),
                    shadow_plan.headroom,
                    self.settings.concurrency_retry_ms,
                );
                telemetry::shadow_denial(tier, &denial);
                tracing::info!(
                    tenant = %plan.id.tenant,
                    tier,
                    reason = denial.reason.as_str(),
                    level = denial.level.map_or("none", |l| l.as_str()),
                    "the quota in shadow would deny this request: {}",
                    denial.detail
                );
                ShadowCheck {
                    denial: Some(denial),
                    taken: false,
                }
            }
            Ok(_) => nothing,
            Err(e) => {
                tracing::warn!(error = %e, "shadow quota check skipped");
                nothing
            }
        }
    }

    /// Mirrors a settlement on the shadow reservation, if one was taken. Best
    /// effort: a shadow reservation that was never taken is simply not found.
    pub(super) async fn shadow_settle(&self, id: &ReservationId, how: ShadowSettle) {
        let limits = self.limits();
        let Some(shadow) = limits
            .resolve(&id.tier, id.tenant.as_str())
            .and_then(|t| t.shadow.clone())
        else {
            return;
        };
        let group = limits.models.get(&id.group);
        let now = self.shadow.now_us();
        let levels = plan::shadow_levels(&shadow, group, id.user.is_some(), true, now);
        let s = Settlement {
            id,
            levels: &levels,
        };
        let result = match how {
            ShadowSettle::Commit(usage) => self
                .budget
                .call("shadow_commit", self.shadow.commit(s, usage))
                .await
                .map(drop),
            ShadowSettle::Refund => self
                .budget
                .call("shadow_refund", self.shadow.refund(s))
                .await
                .map(drop),
            ShadowSettle::Renew { ttl_ms } => self
                .budget
                .call("shadow_renew", self.shadow.renew(s, ttl_ms))
                .await
                .map(drop),
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "shadow settlement skipped");
        }
    }
}
