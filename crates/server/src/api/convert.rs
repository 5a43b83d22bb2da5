//! Protobuf ↔ domain conversions: every request's fields parsed and
//! validated here, once, into the engine's typed requests; every answer back.
//! Field validation errors name the proto field.
//!
//! Size: one table of field rules, request by request, then the answers;
//! split by RPC, each file would repeat the shared id and count checks.

use crate::domain::decision::LimitState;
use crate::domain::mix::GROUP_NAMES;
use crate::domain::plan::{ReserveRequest, check_tokens};
use crate::domain::statuses::Statuses;
use crate::domain::tier::MAX_COUNT;
use crate::domain::{
    ChatMessage, DimMap, Dimension, IdempotencyKey, InvalidInput, Level, Priority, Prompt,
    PromptInput, Reason, ReservationId, SessionId, TenantId, UserId, is_tier_name,
};
use crate::engine::{
    CommitOutcome, CommitRequest, Completion, EstimatorView, LevelLeases, Outcome, RefundOutcome,
    RenewOutcome, ReserveOutcome, StatusOutcome, StatusRequest,
};
use crate::pb;

/// Longest model name accepted, in bytes.
pub(crate) const MAX_MODEL_BYTES: usize = 256;

/// Most chat messages one request may carry.
pub(super) const MAX_MESSAGES: usize = 100_000;

/// A CheckAndReserve request, validated.
pub(super) fn reserve_request(
    r: pb::CheckAndReserveRequest,
) -> Result<ReserveRequest, InvalidInput> {
    let tenant = TenantId::parse(&r.tenant_id)?;
    let user = optional_user(&r.user_id)?;
    let session = optional_session(&r.session_id)?;
    check_tier(&r.tier)?;
    check_label("model", &r.model)?;
    let given = [
        r.prompt_tokens.is_some(),
        !r.messages.is_empty(),
        !r.prompt.is_empty(),
    ];
    let prompt = match given {
        [true, false, false] => PromptInput::Tokens(check_tokens(
            "prompt_tokens",
            r.prompt_tokens.unwrap_or_default(),
        )?),
        [false, true, false] => PromptInput::Text(Prompt::Messages(messages(r.messages)?)),
        [false, false, true] => PromptInput::Text(Prompt::Text(r.prompt)),
        [false, false, false] => {
            return Err(InvalidInput::new(
                "prompt_tokens",
                "the prompt is missing: set exactly one of prompt_tokens (your own count), \
                 messages (chat) or prompt (plain text)",
            ));
        }
        _ => {
            return Err(InvalidInput::new(
                "prompt_tokens",
                "set exactly one of prompt_tokens, messages and prompt, not several",
            ));
        }
    };
    let idempotency_key = match r.idempotency_key.as_str() {
        "" => None,
        k => Some(IdempotencyKey::parse(k)?),
    };
    let min_output_tokens = match r.allow_reduced_output {
        true => Some(check_tokens("min_output_tokens", r.min_output_tokens)?),
        false => None,
    };
    Ok(ReserveRequest {
        tenant,
        user,
        session,
        tier: r.tier,
        model: r.model,
        fallbacks: Vec::new(),
        statuses: statuses(r.limit_statuses)?,
        prompt,
        max_output_tokens: check_tokens("max_output_tokens", r.max_output_tokens)?,
        min_output_tokens,
        idempotency_key,
        lease_ttl_ms: r.lease_ttl_ms,
        priority: priority(r.priority)?,
        declared: images(r.images)?,
    })
}

/// Which limits' statuses the answer carries; unspecified is all.
fn statuses(value: i32) -> Result<Statuses, InvalidInput> {
    match pb::LimitStatuses::try_from(value) {
        Ok(pb::LimitStatuses::Unspecified | pb::LimitStatuses::All) => Ok(Statuses::All),
        Ok(pb::LimitStatuses::Binding) => Ok(Statuses::Binding),
        Ok(pb::LimitStatuses::None) => Ok(Statuses::None),
        Err(_) => Err(InvalidInput::new(
            "limit_statuses",
            format!(
                "{value} is not a LimitStatuses; use LIMIT_STATUSES_ALL, \
                 LIMIT_STATUSES_BINDING or LIMIT_STATUSES_NONE (or leave it unset for all)"
            ),
        )),
    }
}

/// The request's priority; unspecified is normal.
fn priority(value: i32) -> Result<Priority, InvalidInput> {
    match pb::Priority::try_from(value) {
        Ok(pb::Priority::Unspecified | pb::Priority::Normal) => Ok(Priority::Normal),
        Ok(pb::Priority::Critical) => Ok(Priority::Critical),
        Ok(pb::Priority::Batch) => Ok(Priority::Batch),
        Err(_) => Err(InvalidInput::new(
            "priority",
            format!(
                "{value} is not a Priority; use PRIORITY_CRITICAL, PRIORITY_NORMAL or \
                 PRIORITY_BATCH (or leave it unset for normal)"
            ),
        )),
    }
}

/// Chat messages: roles and names are short labels; contents are any text.
fn messages(list: Vec<pb::Message>) -> Result<Vec<ChatMessage>, InvalidInput> {
    if list.len() > MAX_MESSAGES {
        return Err(InvalidInput::new(
            "messages",
            format!(
                "{} messages; at most {MAX_MESSAGES} are accepted",
                list.len()
            ),
        ));
    }
    list.into_iter()
        .map(|m| {
            check_label("messages.role", &m.role)?;
            check_label("messages.name", &m.name)?;
            Ok(ChatMessage {
                role: m.role,
                content: m.content,
                name: (!m.name.is_empty()).then_some(m.name),
            })
        })
        .collect()
}

/// The images a call declares (may generate at CheckAndReserve, generated
/// at Commit), at most 2^40.
fn images(n: u64) -> Result<DimMap<u64>, InvalidInput> {
    if n > MAX_COUNT {
        return Err(InvalidInput::new(
            "images",
            format!("{n} is above the maximum of {MAX_COUNT} images"),
        ));
    }
    Ok(DimMap::with([(Dimension::Images, n)]))
}

/// A Commit request, validated: the reservation id, the counts, and the
/// parts of the prompt (cache reads and writes) and of the completion
/// (reasoning) no larger than their whole.
pub(super) fn commit_request(r: pb::CommitRequest) -> Result<CommitRequest, InvalidInput> {
    if r.reasoning_tokens > 0 && !r.completion_text.is_empty() {
        return Err(InvalidInput::new(
            "reasoning_tokens",
            "goes with completion_tokens (the upstream's usage, reasoning included), not with \
             completion_text",
        ));
    }
    let reasoning = r.reasoning_tokens;
    let completion = completion(r.completion_tokens, r.completion_text)?;
    if let Completion::Tokens(n) = completion
        && reasoning > n
    {
        return Err(InvalidInput::new(
            "reasoning_tokens",
            format!(
                "{reasoning} is above completion_tokens {n}: reasoning tokens are part of the \
                 completion (OpenAI's completion_tokens_details.reasoning_tokens)"
            ),
        ));
    }
    let id = ReservationId::parse(&r.reservation_id)?;
    let prompt = check_tokens("prompt_tokens", r.prompt_tokens)?;
    let parts = [
        ("cached_prompt_tokens", r.cached_prompt_tokens),
        ("cache_write_prompt_tokens", r.cache_write_prompt_tokens),
        (
            "cache_write_1h_prompt_tokens",
            r.cache_write_1h_prompt_tokens,
        ),
    ];
    let mut sum = 0u64;
    for (field, n) in parts {
        sum = sum.saturating_add(n);
        if sum > prompt {
            return Err(InvalidInput::new(
                field,
                format!(
                    "cache reads and writes of {sum} tokens are above prompt_tokens {prompt}: \
                     they are parts of the prompt (a gateway adds Anthropic's input_tokens, \
                     cache_creation_input_tokens and cache_read_input_tokens into \
                     prompt_tokens); send parts that sum to at most prompt_tokens"
                ),
            ));
        }
    }
    Ok(CommitRequest {
        id,
        prompt_tokens: prompt,
        completion,
        cached_prompt_tokens: r.cached_prompt_tokens,
        cache_write_prompt_tokens: r.cache_write_prompt_tokens,
        cache_write_1h_prompt_tokens: r.cache_write_1h_prompt_tokens,
        reasoning_tokens: reasoning,
        declared: images(r.images)?,
    })
}

/// A GetStatus request, validated.
pub(super) fn status_request(r: pb::GetStatusRequest) -> Result<StatusRequest, InvalidInput> {
    let tenant = TenantId::parse(&r.tenant_id)?;
    let user = optional_user(&r.user_id)?;
    let session = optional_session(&r.session_id)?;
    check_tier(&r.tier)?;
    Ok(StatusRequest {
        tenant,
        user,
        session,
        tier: r.tier,
        model: optional_model(r.model)?,
    })
}

/// The longest a CheckAndReserve may wait in line (`max_wait_ms`).
pub(super) const MAX_WAIT_MS: u64 = 60_000;

/// `max_wait_ms` as a duration: at most [`MAX_WAIT_MS`].
pub(super) fn max_wait(ms: u64) -> Result<std::time::Duration, InvalidInput> {
    if ms > MAX_WAIT_MS {
        return Err(InvalidInput::new(
            "max_wait_ms",
            format!(
                "is {ms}; at most {MAX_WAIT_MS} (a minute): a call that must wait longer is \
                 better retried after its retry_after_ms"
            ),
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// An optional model name (GetStatus, GetEstimator): empty means none.
pub(super) fn optional_model(model: String) -> Result<Option<String>, InvalidInput> {
    check_label("model", &model)?;
    Ok((!model.is_empty()).then_some(model))
}

/// A short label (model, role, name): at most 256 bytes, no control characters.
pub(super) fn check_label(field: &'static str, value: &str) -> Result<(), InvalidInput> {
    if value.len() > MAX_MODEL_BYTES || value.chars().any(char::is_control) {
        return Err(InvalidInput::new(
            field,
            format!("must be at most {MAX_MODEL_BYTES} bytes without control characters"),
        ));
    }
    Ok(())
}

/// A tier name as a request names it: 1-64 characters of a-z, A-Z, 0-9, `-_.`.
fn check_tier(tier: &str) -> Result<(), InvalidInput> {
    if tier.is_empty() {
        return Err(InvalidInput::new(
            "tier",
            "is required (e.g. \"free\", \"pro\")",
        ));
    }
    if !is_tier_name(tier) {
        let shown: String = tier.chars().take(64).filter(|c| !c.is_control()).collect();
        return Err(InvalidInput::new(
            "tier",
            format!(
                "{shown:?} is not a tier name (1-64 characters of a-z, A-Z, 0-9, '-', '_', '.')"
            ),
        ));
    }
    Ok(())
}

/// An optional user id: empty means none.
fn optional_user(user_id: &str) -> Result<Option<UserId>, InvalidInput> {
    match user_id {
        "" => Ok(None),
        u => UserId::parse(u).map(Some),
    }
}

/// An optional session id: empty means no session level.
pub(super) fn optional_session(session_id: &str) -> Result<Option<SessionId>, InvalidInput> {
    match session_id {
        "" => Ok(None),
        s => SessionId::parse(s).map(Some),
    }
}

/// The response to CheckAndReserve.
pub(super) fn reserve_response(out: ReserveOutcome) -> pb::CheckAndReserveResponse {
    let mut resp = pb::CheckAndReserveResponse {
        allowed: out.denial.is_none(),
        reservation_id: out.reservation_id.unwrap_or_default(),
        reserved_tokens: out.reserved_tokens,
        max_output_tokens: out.max_output_tokens,
        limits: out.limits.iter().map(limit_status).collect(),
        lease_expires_in_ms: out.lease_expires_in_ms,
        replayed: out.replayed,
        estimated_prompt_tokens: out.estimated_prompt_tokens,
        estimator_multiplier: out.estimator_multiplier,
        granted_max_output_tokens: out.granted_max_output_tokens,
        reserved_output_tokens: out.reserved_output_tokens,
        degraded: out.degraded,
        waited_ms: out.waited_ms,
        ..Default::default()
    };
    if let Some(d) = out.shadow_denial {
        resp.shadow_denied = true;
        resp.set_shadow_reason(reason(d.reason));
        resp.set_shadow_limiting_level(d.level.map_or(pb::Level::Unspecified, level));
        resp.shadow_detail = d.detail;
    }
    if let Some(d) = out.denial {
        resp.set_reason(reason(d.reason));
        resp.set_limiting_level(d.level.map_or(pb::Level::Unspecified, level));
        resp.set_limiting_dimension(d.dimension.map_or(pb::Dimension::Unspecified, dimension));
        resp.limiting_period_seconds = d.period_secs;
        resp.retry_after_ms = d.retry_after_ms;
        resp.limiting_model_group = d.model_group.unwrap_or_default();
        resp.detail = d.detail;
    }
    resp
}

/// The response to GetEstimator.
pub(super) fn estimator_response(views: Vec<EstimatorView>) -> pb::GetEstimatorResponse {
    pb::GetEstimatorResponse {
        keys: views
            .into_iter()
            .map(|v| pb::EstimatorState {
                key: v.key,
                multiplier: v.multiplier,
                samples: v.samples,
                p95_ratio: v.p95_ratio,
                refreshed_ms_ago: v.refreshed_ms_ago.unwrap_or(0),
                correction: v.correction.as_str().into(),
                content_fit: v.fit.map(|f| pb::ContentFit {
                    costs: GROUP_NAMES
                        .iter()
                        .zip(f.costs)
                        .map(|(group, cost)| pb::GroupCost {
                            group: (*group).into(),
                            cost,
                        })
                        .collect(),
                    constant: f.constant,
                    bound: f.bound,
                    samples: f.samples as u64,
                }),
                learned_outputs: v
                    .learned_outputs
                    .into_iter()
                    .map(|(tier, l)| pb::LearnedOutput {
                        tier,
                        samples: l.samples as u64,
                        tokens: l.tokens.unwrap_or(0),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// The response to GetStatus.
pub(super) fn status_response(out: StatusOutcome) -> pb::GetStatusResponse {
    pb::GetStatusResponse {
        limits: out.limits.iter().map(limit_status).collect(),
        leases: out.leases.iter().map(level_leases).collect(),
        degraded: out.degraded,
    }
}

fn level_leases(l: &LevelLeases) -> pb::LevelLeases {
    pb::LevelLeases {
        level: level(l.level) as i32,
        active: l.active,
        limit: l.limit,
        model_group: l.model_group.clone().unwrap_or_default(),
    }
}

fn limit_status(s: &LimitState) -> pb::LimitStatus {
    pb::LimitStatus {
        level: level(s.level) as i32,
        dimension: dimension(s.dimension) as i32,
        period_seconds: s.period_secs,
        limit: s.limit,
        remaining: s.remaining,
        reset_after_ms: s.reset_after_ms,
        model_group: s
            .model_group
            .as_ref()
            .map_or(String::new(), |g| g.name.clone()),
        window: s.window.map_or(String::new(), |w| w.kind.as_str().into()),
        timezone: s.window.map_or(String::new(), |w| w.tz.name().into()),
    }
}

/// A Commit's completion: the upstream's count, or the text to count when the
/// upstream reported none. Both at once is ambiguous, so it is refused.
fn completion(tokens: u64, text: String) -> Result<Completion, InvalidInput> {
    match (tokens, text.is_empty()) {
        (n, true) => Ok(Completion::Tokens(check_tokens("completion_tokens", n)?)),
        (0, false) => Ok(Completion::Text(text)),
        (n, false) => Err(InvalidInput::new(
            "completion_text",
            format!(
                "sent with completion_tokens {n}: send the upstream's count in completion_tokens, \
                 or the delivered text in completion_text when the upstream reported no usage, \
                 not both"
            ),
        )),
    }
}

/// The response to Commit.
pub(super) fn commit_response(c: CommitOutcome) -> pb::CommitResponse {
    pb::CommitResponse {
        outcome: outcome(c.outcome) as i32,
        token_delta: c.token_delta,
        estimation_ratio: c.estimation_ratio,
        estimation_error_tokens: c.estimation_error_tokens,
        cost_micros: c.cost_micros,
        completion_tokens: c.completion_tokens,
    }
}

/// The response to Refund.
pub(super) fn refund_response(r: RefundOutcome) -> pb::RefundResponse {
    pb::RefundResponse {
        outcome: outcome(r.outcome) as i32,
        refunded_tokens: r.refunded_tokens,
        cost_micros: r.cost_micros,
    }
}

/// The response to RenewLease.
pub(super) fn renew_response(r: RenewOutcome) -> pb::RenewLeaseResponse {
    pb::RenewLeaseResponse {
        outcome: outcome(r.outcome) as i32,
        expires_in_ms: r.expires_in_ms,
    }
}

fn outcome(o: Outcome) -> pb::Outcome {
    match o {
        Outcome::Applied => pb::Outcome::Applied,
        Outcome::AlreadySettled => pb::Outcome::AlreadySettled,
        Outcome::Expired => pb::Outcome::Expired,
    }
}

/// The domain reason of an API reason (`None`: unspecified, allowed).
pub fn reason_of(r: pb::Reason) -> Option<Reason> {
    Reason::ALL.into_iter().find(|x| reason(*x) == r)
}

pub(super) fn reason(r: Reason) -> pb::Reason {
    match r {
        Reason::RequestsExceeded => pb::Reason::RpmExceeded,
        Reason::TokensExceeded => pb::Reason::TpmExceeded,
        Reason::ConcurrencyExceeded => pb::Reason::ConcurrencyExceeded,
        Reason::ContextTooLarge => pb::Reason::ContextTooLarge,
        Reason::RequestTooLarge => pb::Reason::RequestTooLarge,
        Reason::BudgetExceeded => pb::Reason::BudgetExceeded,
        Reason::Blocked => pb::Reason::Blocked,
        Reason::ImagesExceeded => pb::Reason::ImagesExceeded,
    }
}

pub(super) fn level(l: Level) -> pb::Level {
    match l {
        Level::Global => pb::Level::Global,
        Level::Tenant => pb::Level::Tenant,
        Level::User => pb::Level::User,
        Level::Session => pb::Level::Session,
    }
}

pub(super) fn dimension(d: Dimension) -> pb::Dimension {
    match d {
        Dimension::Requests => pb::Dimension::Requests,
        Dimension::Tokens => pb::Dimension::Tokens,
        Dimension::InputTokens => pb::Dimension::InputTokens,
        Dimension::OutputTokens => pb::Dimension::OutputTokens,
        Dimension::Spend => pb::Dimension::Spend,
        Dimension::Images => pb::Dimension::Images,
        Dimension::Concurrency => pb::Dimension::Concurrency,
    }
}
