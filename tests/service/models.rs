//! Limits as upstream accounts set them, end to end over both stores: model
//! groups with their own global limits, per-model tier limits, input and
//! output tokens, cached prompt tokens, context windows, and priority
//! headroom. Periods are a day or more, so refill during a test stays below
//! one unit.

use crate::support;

use ctxbudget::config::FileConfig;
use ctxbudget::pb::{self, Dimension, Level, Priority, Reason};
use support::{Backend, Harness, reserve};
use tonic::Code;

on_every_store!(
    a_model_group_is_denied_at_its_global_tpm_while_another_model_passes,
    claude_is_denied_on_output_tokens_while_input_has_room,
    cached_prompt_tokens_leave_the_input_count_only_where_configured,
    a_prompt_over_the_models_context_window_is_refused_naming_it,
    per_model_tier_limits_apply_at_the_user_level,
    a_model_group_keeps_its_own_concurrency_slots,
    batch_is_refused_while_critical_gets_the_last_ten_percent,
    a_quota_in_shadow_reports_a_model_groups_limit,
);

/// Two groups as an operator would set them, one more with a small window,
/// and a tier with per-model limits.
const MODELS: &str = r#"
[models.gpt-4o]
match = ["gpt-4o", "gpt-4o-2024-*"]
context_window = 128000
cached_input_counts = true
global = { tokens = [{ limit = 3000, period = "1d" }], input_tokens = [{ limit = 100000, period = "30d" }], concurrency = 2 }

[models.gpt-4o-mini]
match = ["gpt-4o-mini*"]
context_window = 128000

[models.claude-sonnet]
match = ["claude-sonnet-*"]
context_window = 32000
cached_input_counts = false
global = { input_tokens = [{ limit = 100000, period = "30d" }], output_tokens = [{ limit = 1000, period = "1d" }] }

[tiers.pro]
max_context_tokens = 256000
default_max_output_tokens = 100
tenant = { requests = [{ limit = 1000, period = "1d" }] }

[tiers.pro.models.gpt-4o]
user = { requests = [{ limit = 2, period = "1d" }] }

[tiers.pro.shadow.models.gpt-4o-mini]
user = { requests = [{ limit = 1, period = "1d" }] }
"#;

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

fn ask(model: &str, user: &str, prompt: u64, output: u64) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        model: model.into(),
        ..reserve("acme", user, "pro", prompt, output)
    }
}

async fn call(c: &mut Client, r: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    c.check_and_reserve(r).await.expect("rpc").into_inner()
}

async fn allowed(c: &mut Client, r: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    let resp = call(c, r).await;
    assert!(resp.allowed, "expected allowed, got {resp:#?}");
    resp
}

async fn denied(c: &mut Client, r: pb::CheckAndReserveRequest) -> pb::CheckAndReserveResponse {
    let resp = call(c, r).await;
    assert!(!resp.allowed, "expected a denial, got {resp:#?}");
    assert!(!resp.detail.is_empty());
    resp
}

/// The limit of (level, dimension) of `group` ("" for all models).
fn group_limit(
    limits: &[pb::LimitStatus],
    level: Level,
    dimension: Dimension,
    group: &str,
) -> pb::LimitStatus {
    limits
        .iter()
        .find(|l| l.level() == level && l.dimension() == dimension && l.model_group == group)
        .unwrap_or_else(|| panic!("no {level:?} {dimension:?} limit of {group:?} in {limits:#?}"))
        .clone()
}

async fn status_of(c: &mut Client, model: &str) -> pb::GetStatusResponse {
    c.get_status(pb::GetStatusRequest {
        tenant_id: "acme".into(),
        user_id: "alice".into(),
        tier: "pro".into(),
        model: model.into(),
        ..Default::default()
    })
    .await
    .expect("status")
    .into_inner()
}

async fn commit(c: &mut Client, id: &str, prompt: u64, completion: u64, cached: u64) {
    c.commit(pb::CommitRequest {
        reservation_id: id.into(),
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_prompt_tokens: cached,
        ..Default::default()
    })
    .await
    .expect("commit");
}

async fn a_model_group_is_denied_at_its_global_tpm_while_another_model_passes(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    let first = allowed(c, ask("gpt-4o", "alice", 1000, 500)).await;
    let tpm = group_limit(&first.limits, Level::Global, Dimension::Tokens, "gpt-4o");
    assert_eq!((tpm.limit, tpm.remaining), (3000, 1500));
    // A dated snapshot is the same group: it takes from the same budget.
    allowed(c, ask("gpt-4o-2024-08-06", "bob", 1000, 500)).await;
    let d = denied(c, ask("gpt-4o", "carol", 1000, 500)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert_eq!(d.limiting_level(), Level::Global);
    assert_eq!(d.limiting_dimension(), Dimension::Tokens);
    assert_eq!(d.limiting_model_group, "gpt-4o");
    assert!(d.detail.contains("gpt-4o"), "{}", d.detail);
    assert!(d.retry_after_ms > 0);
    // gpt-4o-mini has no global token limit: it still passes.
    let mini = allowed(c, ask("gpt-4o-mini", "carol", 1000, 500)).await;
    assert!(
        mini.limits.iter().all(|l| l.model_group != "gpt-4o"),
        "{:#?}",
        mini.limits
    );
    h.stop().await;
}

async fn claude_is_denied_on_output_tokens_while_input_has_room(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    allowed(c, ask("claude-sonnet-4", "alice", 5000, 600)).await;
    let d = denied(c, ask("claude-sonnet-4", "alice", 5000, 600)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert_eq!(d.limiting_dimension(), Dimension::OutputTokens);
    assert_eq!(d.limiting_level(), Level::Global);
    assert_eq!(d.limiting_model_group, "claude-sonnet");
    let input = group_limit(
        &d.limits,
        Level::Global,
        Dimension::InputTokens,
        "claude-sonnet",
    );
    assert_eq!(input.remaining, 95_000, "input has room: {input:?}");
    let output = group_limit(
        &d.limits,
        Level::Global,
        Dimension::OutputTokens,
        "claude-sonnet",
    );
    assert_eq!(output.remaining, 400);
    // With reduced output allowed, what fits is granted.
    let reduced = allowed(
        c,
        pb::CheckAndReserveRequest {
            allow_reduced_output: true,
            min_output_tokens: 100,
            ..ask("claude-sonnet-4", "alice", 5000, 600)
        },
    )
    .await;
    assert_eq!(reduced.granted_max_output_tokens, 400);
    h.stop().await;
}

async fn cached_prompt_tokens_leave_the_input_count_only_where_configured(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    let claude = allowed(c, ask("claude-sonnet-4", "alice", 5000, 100)).await;
    commit(c, &claude.reservation_id, 5000, 50, 4000).await;
    let s = status_of(c, "claude-sonnet-4").await;
    let input = group_limit(
        &s.limits,
        Level::Global,
        Dimension::InputTokens,
        "claude-sonnet",
    );
    assert_eq!(
        input.remaining, 99_000,
        "only the 1000 uncached tokens count"
    );
    let output = group_limit(
        &s.limits,
        Level::Global,
        Dimension::OutputTokens,
        "claude-sonnet",
    );
    assert_eq!(
        output.remaining, 950,
        "the completion replaces the reservation"
    );
    // gpt-4o counts cached input (cached_input_counts = true).
    let gpt = allowed(c, ask("gpt-4o", "alice", 2000, 100)).await;
    commit(c, &gpt.reservation_id, 2000, 50, 1500).await;
    let s = status_of(c, "gpt-4o").await;
    let input = group_limit(&s.limits, Level::Global, Dimension::InputTokens, "gpt-4o");
    assert_eq!(input.remaining, 98_000);
    // More cached tokens than prompt tokens is a caller's mistake.
    let again = allowed(c, ask("claude-sonnet-4", "bob", 10, 10)).await;
    let err = c
        .commit(pb::CommitRequest {
            reservation_id: again.reservation_id.clone(),
            prompt_tokens: 10,
            completion_tokens: 1,
            cached_prompt_tokens: 11,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("cached_prompt_tokens"), "{err:?}");
    // Nothing changed: the reservation is still there to commit properly.
    commit(c, &again.reservation_id, 10, 1, 10).await;
    h.stop().await;
}

async fn a_prompt_over_the_models_context_window_is_refused_naming_it(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    let d = denied(c, ask("claude-sonnet-4", "alice", 32_000, 100)).await;
    assert_eq!(d.reason(), Reason::ContextTooLarge);
    assert_eq!(d.retry_after_ms, 0);
    assert_eq!(d.limiting_model_group, "claude-sonnet");
    assert!(
        d.detail
            .contains("context window of the claude-sonnet models of 32000"),
        "{}",
        d.detail
    );
    // The same prompt fits a model whose window is larger.
    allowed(c, ask("gpt-4o-mini", "alice", 32_000, 100)).await;
    // Above the tier's max context, the tier is what binds.
    let d = denied(c, ask("some-other-model", "alice", 256_000, 100)).await;
    assert_eq!(d.reason(), Reason::ContextTooLarge);
    assert!(d.detail.contains("pro tier's max context"), "{}", d.detail);
    assert!(d.limiting_model_group.is_empty());
    h.stop().await;
}

async fn per_model_tier_limits_apply_at_the_user_level(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    // Committed as they go: the group's 2 concurrency slots stay free.
    for _ in 0..2 {
        let r = allowed(c, ask("gpt-4o", "alice", 10, 10)).await;
        commit(c, &r.reservation_id, 10, 10, 0).await;
    }
    let d = denied(c, ask("gpt-4o", "alice", 10, 10)).await;
    assert_eq!(d.reason(), Reason::RpmExceeded);
    assert_eq!(d.limiting_level(), Level::User);
    assert_eq!(d.limiting_model_group, "gpt-4o");
    // Another user, and the same user on another model, still pass.
    allowed(c, ask("gpt-4o-mini", "alice", 10, 10)).await;
    let bob = allowed(c, ask("gpt-4o", "bob", 10, 10)).await;
    let user = group_limit(&bob.limits, Level::User, Dimension::Requests, "gpt-4o");
    assert_eq!((user.limit, user.remaining), (2, 1));
    // The tenant's all-model limit counted every one of them.
    let tenant = group_limit(&bob.limits, Level::Tenant, Dimension::Requests, "");
    assert_eq!(tenant.remaining, 1000 - 4);
    h.stop().await;
}

async fn a_model_group_keeps_its_own_concurrency_slots(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    let a = allowed(c, ask("gpt-4o", "u1", 10, 10)).await;
    allowed(c, ask("gpt-4o", "u2", 10, 10)).await;
    let d = denied(c, ask("gpt-4o", "u3", 10, 10)).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    assert_eq!(d.limiting_level(), Level::Global);
    assert_eq!(d.limiting_model_group, "gpt-4o");
    allowed(c, ask("gpt-4o-mini", "u3", 10, 10)).await;
    let s = status_of(c, "gpt-4o").await;
    let slots = s
        .leases
        .iter()
        .find(|l| l.model_group == "gpt-4o")
        .expect("the group's slots are reported");
    assert_eq!(
        (slots.level(), slots.active, slots.limit),
        (Level::Global, 2, 2)
    );
    commit(c, &a.reservation_id, 10, 5, 0).await;
    allowed(c, ask("gpt-4o", "u3", 10, 10)).await;
    h.stop().await;
}

async fn a_quota_in_shadow_reports_a_model_groups_limit(backend: Backend) {
    let mut h = Harness::start(backend, MODELS).await;
    let c = &mut h.client;
    let first = allowed(c, ask("gpt-4o-mini", "alice", 10, 10)).await;
    assert!(!first.shadow_denied);
    // The rolled-out limit of one mini request a day would deny the second;
    // it is only reported.
    let second = allowed(c, ask("gpt-4o-mini", "alice", 10, 10)).await;
    assert!(second.shadow_denied, "{second:#?}");
    assert_eq!(second.shadow_reason(), Reason::RpmExceeded);
    assert_eq!(second.shadow_limiting_level(), Level::User);
    assert!(
        second.shadow_detail.contains("gpt-4o-mini"),
        "{}",
        second.shadow_detail
    );
    // Another model is not under it.
    let other = allowed(c, ask("claude-sonnet-4", "alice", 10, 10)).await;
    assert!(!other.shadow_denied);
    h.stop().await;
}

const PRIORITIES: &str = r#"
[priorities]
normal = 0.1
batch = 0.3

[tiers.pro]
max_context_tokens = 256000
default_max_output_tokens = 100
tenant = { tokens = [{ limit = 1000, period = "1d" }], concurrency = 10 }
"#;

fn with_priority(prompt: u64, priority: Priority) -> pb::CheckAndReserveRequest {
    pb::CheckAndReserveRequest {
        priority: priority as i32,
        ..ask("gpt-4o", "", prompt, 1)
    }
}

async fn batch_is_refused_while_critical_gets_the_last_ten_percent(backend: Backend) {
    let mut h = Harness::start(backend, PRIORITIES).await;
    let c = &mut h.client;
    // 600 of 1000 taken: 400 left.
    allowed(c, with_priority(599, Priority::Normal)).await;
    // Batch must leave 300: 200 would leave 200.
    let d = denied(c, with_priority(199, Priority::Batch)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    assert!(
        d.detail.contains("kept for higher-priority"),
        "{}",
        d.detail
    );
    assert!(d.retry_after_ms > 0);
    // Normal leaves 100; unspecified is normal.
    allowed(c, with_priority(299, Priority::Unspecified)).await;
    let d = denied(c, with_priority(0, Priority::Normal)).await;
    assert_eq!(d.reason(), Reason::TpmExceeded);
    // Critical takes the last 10%, down to nothing.
    allowed(c, with_priority(99, Priority::Critical)).await;
    denied(c, with_priority(0, Priority::Critical)).await;
    // A batch request larger than 70% of a limit can never fit: retrying
    // cannot help.
    let d = denied(
        c,
        pb::CheckAndReserveRequest {
            tenant_id: "beta".into(),
            ..with_priority(749, Priority::Batch)
        },
    )
    .await;
    assert_eq!((d.reason(), d.retry_after_ms), (Reason::RequestTooLarge, 0));
    // Concurrency: batch keeps 3 of 10 slots free, critical takes them all.
    let slot = |p| pb::CheckAndReserveRequest {
        tenant_id: "gamma".into(),
        ..with_priority(1, p)
    };
    for _ in 0..7 {
        allowed(c, slot(Priority::Batch)).await;
    }
    let d = denied(c, slot(Priority::Batch)).await;
    assert_eq!(d.reason(), Reason::ConcurrencyExceeded);
    assert!(
        d.detail.contains("kept for higher-priority"),
        "{}",
        d.detail
    );
    for _ in 0..3 {
        allowed(c, slot(Priority::Critical)).await;
    }
    denied(c, slot(Priority::Critical)).await;
    // An unknown priority is refused, naming the field.
    let err = c
        .check_and_reserve(pb::CheckAndReserveRequest {
            priority: 9,
            ..ask("gpt-4o", "", 1, 1)
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("priority"), "{err:?}");
    h.stop().await;
}

#[test]
fn overlapping_model_groups_are_a_configuration_error_naming_both_patterns() {
    let toml = r#"
[models.gpt-4o]
match = ["gpt-4o", "gpt-4o-2024-*"]
[models.everything-gpt]
match = ["gpt-*"]
"#;
    let err = FileConfig::built_in()
        .overlay(FileConfig::parse(toml, "t").unwrap())
        .settings(Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"gpt-*\""), "{err}");
    assert!(err.contains("\"gpt-4o\""), "{err}");
    let unknown = r#"
[tiers.pro]
max_context_tokens = 1000
default_max_output_tokens = 10
[tiers.pro.models.nope]
user = { requests = [{ limit = 1, period = "1m" }] }
"#;
    let err = FileConfig::built_in()
        .overlay(FileConfig::parse(unknown, "t").unwrap())
        .settings(Default::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("tiers.pro.models.nope"), "{err}");
}
