//! Turning a validated request, its prompt's count and the configured limits
//! (the request's tier already resolved, [`Terms`]) into a reservation plan:
//! which buckets and concurrency limits apply at which level, and what it costs.
//! Requests that can never fit (context too large, more tokens than a bucket can
//! hold) are refused here, before any store is asked.
//!
//! Which levels a request passes through is [`super::level_plan`]'s, re-exported
//! here.
//!
//! Size: planning is one flow (model group, context, output bounds, headroom,
//! levels, refusals, fingerprint) with its request type; over half the file is
//! its tests.

use super::bucket::Cost;
use super::decision::Denial;
use super::ids::{Fnv, IdempotencyKey, InvalidInput, ReservationId, SessionId, TenantId, UserId};
use super::level::{DimMap, Level};
pub use super::level_plan::{LevelPlan, Scope, levels, shadow_levels};
use super::limits::Limits;
use super::mix::PromptMix;
use super::model::ModelGroup;
use super::price::{Rates, SpendRates};
use super::priority::{Priorities, Priority};
use super::prompt::{PromptCount, PromptInput};
use super::statuses::Statuses;
use super::tier::{MAX_COUNT, Tier};
use std::sync::Arc;

/// How long concurrency leases last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasePolicy {
    /// Used when a request gives no lease length.
    pub default_ttl_ms: u64,
    /// The longest lease a request may ask for.
    pub max_ttl_ms: u64,
}

impl LeasePolicy {
    /// The lease length for a request's `lease_ttl_ms` (absent or 0: the default).
    pub fn ttl_ms(&self, field: &'static str, requested: Option<u64>) -> Result<u64, InvalidInput> {
        match requested {
            None | Some(0) => Ok(self.default_ttl_ms),
            Some(ms) if ms > self.max_ttl_ms => Err(InvalidInput::new(
                field,
                format!(
                    "{ms} ms is above the maximum lease of {max} ms; ask for at most {max} ms \
                     and extend it with RenewLease before it lapses",
                    max = self.max_ttl_ms
                ),
            )),
            Some(ms) => Ok(ms),
        }
    }
}

/// A CheckAndReserve request, fields validated (in `api/`): what the caller
/// asked for, its prompt as given. The one request type from the API to the
/// plan: the engine counts the prompt ([`PromptCount`], kept beside the
/// request) and [`prepare`] plans the two.
#[derive(Clone, Debug)]
pub struct ReserveRequest {
    /// The customer.
    pub tenant: TenantId,
    /// The user, if user-level limits apply.
    pub user: Option<UserId>,
    /// The session, if session-level limits apply.
    pub session: Option<SessionId>,
    /// The tier name.
    pub tier: String,
    /// The upstream model: picks the tokenizer, the estimator key and the
    /// model group, and is part of the fingerprint.
    pub model: String,
    /// Models to try in order when `model` has no room (fallback
    /// candidates); empty for one model. [`Self::candidates`] lists all.
    pub fallbacks: Vec<String>,
    /// The prompt.
    pub prompt: PromptInput,
    /// Output tokens; 0 means the tier's default.
    pub max_output_tokens: u64,
    /// With reduced output allowed: the fewest output tokens worth granting.
    pub min_output_tokens: Option<u64>,
    /// Makes a retried call return the first reservation.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Requested lease length.
    pub lease_ttl_ms: Option<u64>,
    /// How much the request matters: picks the headroom it must leave.
    pub priority: Priority,
    /// What the call may use in each dimension the caller counts
    /// ([`crate::Dimension::is_declared`]; 0 elsewhere).
    pub declared: DimMap<u64>,
    /// Which limits' statuses the answer carries.
    pub statuses: Statuses,
}

impl ReserveRequest {
    /// The models this request may reserve, in the order they are tried:
    /// `model`, then the fallbacks. One model is a one-element list.
    pub fn candidates(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.model.as_str()).chain(self.fallbacks.iter().map(String::as_str))
    }
}

/// What a request is planned under, besides the request and its count.
#[derive(Clone, Copy)]
pub struct Terms<'a> {
    /// The limits in force.
    pub limits: &'a Limits,
    /// The request's tier under `limits`, the tenant's overrides applied:
    /// resolved once, by the caller, before the prompt is counted.
    pub tier: &'a Tier,
    /// Lease lengths.
    pub leases: LeasePolicy,
    /// The share of every limit each priority must leave.
    pub priorities: Priorities,
    /// When (µs, the store's clock): where calendar windows' boundaries fall.
    pub now_us: i64,
}

/// Everything a store needs to make one reservation.
#[derive(Clone, Debug)]
pub struct ReservePlan {
    /// The id the reservation will have.
    pub id: ReservationId,
    /// The limited levels, outermost first.
    pub levels: Vec<LevelPlan>,
    /// The model's group, if it has one.
    pub model_group: Option<Arc<ModelGroup>>,
    /// The share of every limit this reservation must leave (its priority's
    /// headroom): a bucket must keep `headroom × limit` after the cost, a
    /// concurrency limit as many free slots.
    pub headroom: f64,
    /// The model group's rates at the reserved prompt's size (its
    /// long-context tier), if it has a price: spend buckets take
    /// `ceil((prompt × input + output granted × output) / 10⁶)` µ$ and the
    /// call's fee.
    pub price: Rates,
    /// Prompt tokens taken from every token bucket.
    pub prompt_tokens: u64,
    /// Output tokens wanted on top.
    pub max_output_tokens: u64,
    /// The fewest output tokens the caller accepts (= max without reduced output).
    pub min_output_tokens: u64,
    /// The service's raw prompt count (0 when the caller counted).
    pub estimated_prompt_tokens: u64,
    /// The raw count's mix, with the content-aware correction: the record
    /// keeps it for the Commit's estimator sample.
    pub prompt_mix: Option<PromptMix>,
    /// The learned output (estimator key and tier): what levels holding the
    /// learned output hold; `None` until enough completions were seen.
    pub learned_output: Option<u64>,
    /// Lease length.
    pub lease_ttl_ms: u64,
    /// What the call may use in each dimension the caller counts.
    pub declared: DimMap<u64>,
    /// The caller's idempotency key, if any.
    pub idempotency_key: Option<IdempotencyKey>,
    /// Digest of the request; a replayed idempotency key must match it.
    pub fingerprint: u64,
}

impl ReservePlan {
    /// Bit set of the levels that hold a lease for this reservation.
    pub fn lease_mask(&self) -> u8 {
        self.levels
            .iter()
            .filter(|l| l.concurrency.is_some())
            .fold(0, |m, l| m | l.bit())
    }

    /// Tokens taken with the full output granted.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.max_output_tokens
    }

    /// The cost with the full output granted.
    pub fn cost(&self) -> Cost {
        self.cost_with(self.max_output_tokens)
    }

    /// The cost with `output` tokens granted.
    pub fn cost_with(&self, output: u64) -> Cost {
        Cost::reservation(
            self.prompt_tokens,
            output,
            self.spend_rates().spend(output as f64) as u64,
            &self.declared,
        )
    }

    /// What the prompt, the call's fee and what it declared cost, and the
    /// output price: the spend rule of this reservation.
    pub fn spend_rates(&self) -> SpendRates {
        SpendRates::new(self.price, self.prompt_tokens).with_declared(&self.price, &self.declared)
    }

    /// The same request against a quota in shadow: other levels, same id, no
    /// idempotency key (the enforced reservation already dedupes retries).
    pub fn for_shadow(&self, levels: Vec<LevelPlan>) -> ReservePlan {
        ReservePlan {
            levels,
            idempotency_key: None,
            ..self.clone()
        }
    }
}

/// The result of planning: a plan for the store, or a refusal no store can change.
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per request, moved once: boxing the plan would add an allocation to every reservation"
)]
pub enum Prepared {
    /// Ask the store.
    Plan(ReservePlan),
    /// Refused before the store: context or request too large.
    Refused {
        /// Why.
        denial: Denial,
        /// Prompt + output tokens the request asked for.
        tokens: u64,
        /// The output part of `tokens`.
        max_output_tokens: u64,
    },
}

/// Plans a reservation of `req` for `model` (one of its
/// [candidates](ReserveRequest::candidates)), its prompt counted as `count`,
/// under `terms`.
#[expect(
    clippy::too_many_lines,
    reason = "the planning steps in order; split, they would pass a dozen locals along"
)]
pub fn prepare(
    req: &ReserveRequest,
    model: &str,
    count: &PromptCount,
    terms: &Terms<'_>,
) -> Result<Prepared, InvalidInput> {
    let Terms { limits, tier, .. } = *terms;
    let group = limits.group_of(model).cloned();
    let lease_ttl_ms = terms.leases.ttl_ms("lease_ttl_ms", req.lease_ttl_ms)?;
    let (max_output, min_output) = output_bounds(req, tier)?;
    let headroom = terms.priorities.headroom(req.priority);
    let refused = |denial, max_output: u64| Prepared::Refused {
        denial,
        tokens: count.reserve + max_output,
        max_output_tokens: max_output,
    };
    let max_context = max_context(tier, group.as_deref());
    if count.tokens + min_output > max_context {
        return Ok(refused(
            Denial::context_too_large(
                (count.tokens, count.more_than),
                max_output,
                tier,
                group.as_deref(),
            ),
            max_output,
        ));
    }
    // With reduced output allowed, the context caps what may be granted.
    let max_output = max_output.min(max_context - count.tokens);
    let scope = Scope {
        tier: Some(tier),
        group: group.as_ref(),
        has_user: req.user.is_some(),
        has_session: req.session.is_some(),
        now_us: terms.now_us,
    };
    let levels = levels(limits, scope, false);
    // The rates of the tier the reserved prompt reaches.
    let price = group
        .as_ref()
        .and_then(|g| limits.prices.get(&g.name))
        .map(|p| p.at(count.reserve))
        .unwrap_or_default();
    let smallest = Cost::reservation(
        count.reserve,
        min_output,
        SpendRates::new(price, count.reserve)
            .with_declared(&price, &req.declared)
            .spend(min_output as f64) as u64,
        &req.declared,
    );
    if let Some(denial) = too_large(&levels, smallest, headroom) {
        return Ok(refused(denial, max_output));
    }
    let fingerprint = fingerprint(req, model, count.tokens, headroom, max_output);
    let group_name = group.as_ref().map_or(String::new(), |g| g.name.clone());
    let id = ReservationId::generate(
        req.tenant.clone(),
        req.user.clone(),
        req.tier.clone(),
        count.estimator.clone(),
    )
    .with_group(group_name)
    // Only a reservation the session's limits apply to carries it: ids of
    // the earlier layout, which replicas of the release before sessions read,
    // serve every other.
    .with_session(
        req.session
            .clone()
            .filter(|_| levels.iter().any(|l| l.level == Level::Session)),
    );
    Ok(Prepared::Plan(ReservePlan {
        id,
        levels,
        model_group: group,
        headroom,
        price,
        prompt_tokens: count.reserve,
        max_output_tokens: max_output,
        min_output_tokens: min_output.min(max_output),
        estimated_prompt_tokens: count.estimated,
        prompt_mix: count.mix,
        learned_output: None,
        lease_ttl_ms,
        declared: req.declared,
        idempotency_key: req.idempotency_key.clone(),
        fingerprint,
    }))
}

/// The largest prompt + output a request may have: the tier's max context, or
/// the model group's context window when that is smaller.
pub fn max_context(tier: &Tier, group: Option<&ModelGroup>) -> u64 {
    group
        .and_then(|g| g.context_window)
        .map_or(tier.max_context_tokens, |w| w.min(tier.max_context_tokens))
}

/// The output tokens a request asks for (its own, or the tier's default) and
/// the fewest it accepts (the same, unless reduced output is allowed).
fn output_bounds(req: &ReserveRequest, tier: &Tier) -> Result<(u64, u64), InvalidInput> {
    let max_output = match req.max_output_tokens {
        0 => tier.default_max_output_tokens,
        n => n,
    };
    let min_output = match req.min_output_tokens {
        None => max_output,
        Some(min) if min > max_output => {
            return Err(InvalidInput::new(
                "min_output_tokens",
                format!("{min} is above max_output_tokens {max_output}"),
            ));
        }
        Some(min) => min.max(1),
    };
    Ok((max_output, min_output))
}

/// The refusal of a request whose smallest form (`smallest`) some bucket of
/// `levels` can never hold, leaving the share `headroom` of it.
fn too_large(levels: &[LevelPlan], smallest: Cost, headroom: f64) -> Option<Denial> {
    levels.iter().find_map(|l| {
        l.buckets
            .iter()
            .find(|b| b.denies(b.limit as f64, b.cost(smallest) as f64, headroom))
            .map(|b| Denial::request_too_large(b, l.group_of(b), b.cost(smallest), headroom))
    })
}

/// Digest of what makes two requests "the same" for idempotency: `prompt`
/// is the prompt's count (before any correction).
fn fingerprint(
    req: &ReserveRequest,
    model: &str,
    prompt: u64,
    headroom: f64,
    max_output: u64,
) -> u64 {
    let mut h = Fnv::new();
    h.write(req.user.as_ref().map_or("", |u| u.as_str()).as_bytes());
    h.write(&[0xff]);
    h.write(req.tier.as_bytes());
    h.write(&[0xff]);
    h.write(model.as_bytes());
    h.write_u64(prompt);
    h.write_u64(max_output);
    h.write_u64(req.min_output_tokens.unwrap_or(0));
    // A retry at another priority is another request; the default (no
    // headroom) hashes as before, so fingerprints of old records still match.
    if headroom != 0.0 {
        h.write_u64(headroom.to_bits());
    }
    // Likewise a retry in another session; no session hashes as before.
    if let Some(session) = &req.session {
        h.write(&[0xfe]);
        h.write(session.as_str().as_bytes());
    }
    // Likewise a retry that declares other amounts; none hashes as before.
    for (d, &n) in req.declared.iter().filter(|(_, n)| **n != 0) {
        h.write(&[0xfd, d.code() as u8]);
        h.write_u64(n);
    }
    h.finish()
}

/// Checks a token count from a request: at most 2^40.
pub fn check_tokens(field: &'static str, n: u64) -> Result<u64, InvalidInput> {
    if n > MAX_COUNT {
        return Err(InvalidInput::new(
            field,
            format!("{n} is above the maximum of {MAX_COUNT} tokens"),
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests_support {
    pub(super) use super::tests::{limits, plan, request};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reason;
    use crate::limits::{Level, LevelLimits, Rate};
    use crate::{DimMap, Dimension};
    use std::sync::Arc;

    pub(super) fn limits() -> Limits {
        let tier = Tier {
            weight: 1,
            name: "free".into(),
            tenant: LevelLimits::default(),
            user: LevelLimits {
                rates: DimMap::with([
                    (
                        Dimension::Requests,
                        vec![Rate {
                            limit: 10,
                            period_secs: 60,
                            window: None,
                            alert_at: Default::default(),
                        }],
                    ),
                    (
                        Dimension::Tokens,
                        vec![Rate {
                            limit: 5000,
                            period_secs: 60,
                            window: None,
                            alert_at: Default::default(),
                        }],
                    ),
                ]),
                concurrency: Some(1),
                ..LevelLimits::default()
            },
            session: LevelLimits::default(),
            session_ttl_secs: crate::tier::DEFAULT_SESSION_TTL_SECS,
            max_context_tokens: 8000,
            default_max_output_tokens: 100,
            shadow: None,
            models: Default::default(),
        };
        Limits {
            global: LevelLimits::default(),
            tiers: [("free".to_string(), Arc::new(tier))].into(),
            ..Limits::default()
        }
    }

    pub(super) fn request(prompt: u64, output: u64) -> ReserveRequest {
        ReserveRequest {
            tenant: TenantId::parse("t").unwrap(),
            user: Some(UserId::parse("u").unwrap()),
            session: None,
            tier: "free".into(),
            model: "m".into(),
            fallbacks: Vec::new(),
            statuses: Default::default(),
            prompt: PromptInput::Tokens(prompt),
            max_output_tokens: output,
            min_output_tokens: None,
            idempotency_key: None,
            lease_ttl_ms: None,
            priority: Priority::Normal,
            declared: DimMap::default(),
        }
    }

    /// Plans `req` (a caller's count) under `limits`, its tier resolved.
    pub(super) fn plan(req: &ReserveRequest, limits: &Limits) -> Result<Prepared, InvalidInput> {
        let PromptInput::Tokens(prompt) = req.prompt else {
            panic!("the tests send their own counts");
        };
        let tier = limits.resolve_known(&req.tier, req.tenant.as_str())?;
        let terms = Terms {
            limits,
            tier: &tier,
            leases: LeasePolicy {
                default_ttl_ms: 1000,
                max_ttl_ms: 5000,
            },
            priorities: Priorities::default(),
            now_us: 0,
        };
        prepare(req, &req.model, &PromptCount::given(prompt), &terms)
    }

    #[test]
    fn unlimited_levels_are_skipped_and_default_output_applies() {
        let Prepared::Plan(p) = plan(&request(50, 0), &limits()).unwrap() else {
            panic!("expected a plan");
        };
        assert_eq!(p.levels.len(), 1, "only the user level has limits");
        assert_eq!(p.tokens(), 150);
        assert_eq!(p.lease_mask(), Level::User.bit());
    }

    #[test]
    fn a_session_joins_the_plan_and_the_id_only_where_its_limits_apply() {
        let mut r = request(50, 0);
        r.session = Some(SessionId::parse("run").unwrap());
        let Prepared::Plan(p) = plan(&r, &limits()).unwrap() else {
            panic!("expected a plan");
        };
        assert_eq!(p.levels.len(), 1, "the tier limits no session");
        assert_eq!(p.id.session, None, "an id the previous release reads");
        let mut with = limits();
        let mut tier = (**with.tier("free").unwrap()).clone();
        tier.session.concurrency = Some(1);
        with.tiers.insert("free".into(), Arc::new(tier));
        let Prepared::Plan(p) = plan(&r, &with).unwrap() else {
            panic!("expected a plan");
        };
        assert_eq!(p.levels.last().map(|l| l.level), Some(Level::Session));
        assert_eq!(p.id.session, r.session);
        assert_eq!(p.lease_mask(), Level::User.bit() | Level::Session.bit());
    }

    #[test]
    fn hopeless_requests_are_refused_before_the_store() {
        let refused = |prompt, output| match plan(&request(prompt, output), &limits()) {
            Ok(Prepared::Refused { denial, tokens, .. }) => (denial, tokens),
            other => panic!("expected a refusal, got {other:?}"),
        };
        let (d, tokens) = refused(7000, 1001);
        assert_eq!((d.reason, tokens), (Reason::ContextTooLarge, 8001));
        let (d, _) = refused(5000, 1);
        assert_eq!(d.reason, Reason::RequestTooLarge);
        assert_eq!(d.retry_after_ms, 0);
    }

    #[test]
    fn unknown_tier_and_long_lease_are_invalid() {
        let mut r = request(1, 1);
        r.tier = "gold".into();
        assert_eq!(plan(&r, &limits()).unwrap_err().field, "tier");
        let mut r = request(1, 1);
        r.lease_ttl_ms = Some(5001);
        assert_eq!(plan(&r, &limits()).unwrap_err().field, "lease_ttl_ms");
    }
}

#[cfg(test)]
mod reduced_output {
    use super::tests_support::*;
    use super::*;
    use crate::Dimension;

    #[test]
    fn reduced_output_is_capped_by_the_context_and_checked() {
        let mut big = limits();
        let mut tier = (**big.tier("free").unwrap()).clone();
        tier.user.rates[Dimension::Tokens].clear();
        big.tiers.insert("free".into(), std::sync::Arc::new(tier));
        let mut r = request(7900, 1000);
        r.min_output_tokens = Some(50);
        let Prepared::Plan(p) = plan(&r, &big).unwrap() else {
            panic!("fits with reduced output");
        };
        assert_eq!((p.max_output_tokens, p.min_output_tokens), (100, 50));
        let mut r = request(10, 100);
        r.min_output_tokens = Some(101);
        assert_eq!(plan(&r, &limits()).unwrap_err().field, "min_output_tokens");
    }
}
