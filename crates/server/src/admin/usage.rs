//! A tenant's usage report from the ledger (or one user's), summed by hour,
//! day or month per model group: built here from any store, printed by
//! `ctxbudget usage` and served by the admin API (`/admin/v1/usage`) and the
//! console. The arithmetic is `domain::usage`.

use super::AdminError;
use crate::domain::budget::ledger::Row;
use crate::domain::dimension::{DECLARED_COUNT, DECLARED_FIRST};
use crate::domain::usage::{self, By, Line};
use crate::domain::{DimMap, Dimension, Limits, TenantId, UserId};
use crate::store::Store;
use chrono::{DateTime, NaiveDate};
use serde::Serialize;

/// What a report covers.
#[derive(Clone, Debug)]
pub struct UsageQuery {
    /// The tenant.
    pub tenant: TenantId,
    /// One of its users (daily rows: by day or month).
    pub user: Option<UserId>,
    /// A model group, or a model its patterns match.
    pub model: Option<String>,
    /// From (inclusive), as given: a date or an RFC 3339 time.
    pub from: String,
    /// To (exclusive), as given.
    pub to: String,
    /// How lines sum.
    pub by: By,
}

/// One line of a report. Serialized (JSON, CSV) in this order, then a field
/// per dimension the caller counts (`images`).
#[derive(Clone, Debug)]
pub struct UsageLine {
    /// The period (`2026-12-01`, `2026-12-01T10:00Z`, `2026-12`) or `total`.
    pub period: String,
    /// The model group ("": calls of no group).
    pub model_group: String,
    /// Calls reserved.
    pub requests: u64,
    /// Calls refunded.
    pub refunds: u64,
    /// Calls reserved and not settled yet (or never).
    pub unsettled: u64,
    /// Tokens reserved.
    pub reserved_tokens: u64,
    /// Prompt tokens used.
    pub prompt_tokens: u64,
    /// Of which read from a cache.
    pub cached_prompt_tokens: u64,
    /// Completion tokens used.
    pub completion_tokens: u64,
    /// Cost, µ$.
    pub cost_micros: u64,
    /// Cost, USD, exactly (`12.345678`).
    pub cost_usd: String,
    /// Prompt tokens reserved for the settled calls.
    pub prompt_reserved: u64,
    /// Σ |prompt reserved − prompt|.
    pub prompt_error: u64,
    /// Σ |prompt reserved − prompt| ÷ Σ prompt, in percent.
    pub estimate_error_pct: Option<f64>,
    // Last, so scripts reading the earlier columns by position still work.
    /// Prompt tokens written to a cache (5 minutes).
    pub cache_write_prompt_tokens: u64,
    /// Prompt tokens written to a cache for an hour.
    pub cache_write_1h_prompt_tokens: u64,
    /// Reasoning tokens, of the completion.
    pub reasoning_tokens: u64,
    /// What the committed calls used of each dimension the caller counts.
    pub declared: DimMap<u64>,
}

impl Serialize for UsageLine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut l = s.serialize_struct("UsageLine", CSV_HEADER.len() + DECLARED_COUNT)?;
        l.serialize_field("period", &self.period)?;
        l.serialize_field("model_group", &self.model_group)?;
        l.serialize_field("requests", &self.requests)?;
        l.serialize_field("refunds", &self.refunds)?;
        l.serialize_field("unsettled", &self.unsettled)?;
        l.serialize_field("reserved_tokens", &self.reserved_tokens)?;
        l.serialize_field("prompt_tokens", &self.prompt_tokens)?;
        l.serialize_field("cached_prompt_tokens", &self.cached_prompt_tokens)?;
        l.serialize_field("completion_tokens", &self.completion_tokens)?;
        l.serialize_field("cost_micros", &self.cost_micros)?;
        l.serialize_field("cost_usd", &self.cost_usd)?;
        l.serialize_field("prompt_reserved", &self.prompt_reserved)?;
        l.serialize_field("prompt_error", &self.prompt_error)?;
        l.serialize_field("estimate_error_pct", &self.estimate_error_pct)?;
        l.serialize_field("cache_write_prompt_tokens", &self.cache_write_prompt_tokens)?;
        l.serialize_field(
            "cache_write_1h_prompt_tokens",
            &self.cache_write_1h_prompt_tokens,
        )?;
        l.serialize_field("reasoning_tokens", &self.reasoning_tokens)?;
        for d in &Dimension::RATES[DECLARED_FIRST - 1..] {
            l.serialize_field(d.as_str(), &self.declared[*d])?;
        }
        l.end()
    }
}

/// The CSV header of the lines, for a report with none: the named fields,
/// then each declared dimension's.
pub fn csv_header() -> Vec<&'static str> {
    let mut header = CSV_HEADER.to_vec();
    header.extend(
        Dimension::RATES[DECLARED_FIRST - 1..]
            .iter()
            .map(|d| d.as_str()),
    );
    header
}

const CSV_HEADER: [&str; 17] = [
    "period",
    "model_group",
    "requests",
    "refunds",
    "unsettled",
    "reserved_tokens",
    "prompt_tokens",
    "cached_prompt_tokens",
    "completion_tokens",
    "cost_micros",
    "cost_usd",
    "prompt_reserved",
    "prompt_error",
    "estimate_error_pct",
    "cache_write_prompt_tokens",
    "cache_write_1h_prompt_tokens",
    "reasoning_tokens",
];

impl UsageLine {
    /// The line of `row`.
    pub fn of(period: String, model_group: &str, r: &Row) -> UsageLine {
        let n = |v: f64| v.max(0.0) as u64;
        UsageLine {
            period,
            model_group: model_group.to_owned(),
            requests: n(r.requests),
            refunds: n(r.refunds),
            unsettled: n(r.unsettled),
            reserved_tokens: n(r.reserved_tokens),
            prompt_tokens: n(r.prompt_tokens),
            cached_prompt_tokens: n(r.cached_prompt_tokens),
            completion_tokens: n(r.completion_tokens),
            cost_micros: n(r.cost_micros),
            cost_usd: usd(n(r.cost_micros)),
            prompt_reserved: n(r.prompt_reserved),
            prompt_error: n(r.prompt_error),
            estimate_error_pct: (r.prompt_tokens > 0.0)
                .then(|| (r.prompt_error / r.prompt_tokens * 1e4).round() / 100.0),
            cache_write_prompt_tokens: n(r.cache_write_prompt_tokens),
            cache_write_1h_prompt_tokens: n(r.cache_write_1h_prompt_tokens),
            reasoning_tokens: n(r.reasoning_tokens),
            declared: r.declared.map(|_, &v| n(v)),
        }
    }
}

/// A whole report.
#[derive(Clone, Debug, Serialize)]
pub struct UsageReport {
    /// The tenant.
    pub tenant: String,
    /// The user, if one.
    pub user: Option<String>,
    /// The model group, if one.
    pub model_group: Option<String>,
    /// From, as asked.
    pub from: String,
    /// To, as asked.
    pub to: String,
    /// `hour`, `day` or `month`.
    pub by: &'static str,
    /// The lines, oldest first.
    pub lines: Vec<UsageLine>,
    /// Their sum.
    pub total: UsageLine,
    /// The configuration has model groups (the ungrouped line reads `other
    /// models`, else `all models`).
    pub grouped: bool,
}

/// The report `q` asks for, from `store`'s ledger; `limits` name the model
/// groups (without them, a model cannot be asked for).
pub async fn report<S: Store>(
    store: &S,
    limits: Option<&Limits>,
    q: &UsageQuery,
) -> Result<UsageReport, AdminError> {
    if q.user.is_some() && q.by == By::Hour {
        return Err(AdminError::Invalid(
            "a user's usage is kept per day: sum by day or by month".into(),
        ));
    }
    let invalid = |what: &str, e: String| AdminError::Invalid(format!("{what}: {e}"));
    let from = parse_instant(&q.from).map_err(|e| invalid("from", e))?;
    let to = parse_instant(&q.to).map_err(|e| invalid("to", e))?;
    let periods = usage::periods(from, to, q.by).map_err(|e| AdminError::Invalid(e.to_string()))?;
    let grouped = limits.is_none_or(|l| !l.models.is_empty());
    let group = match (&q.model, limits) {
        (Some(m), Some(l)) => Some(group_named(l, m)?),
        (Some(_), None) => {
            return Err(AdminError::Invalid(
                "the configuration cannot be read, so no model group can be named".into(),
            ));
        }
        (None, _) => None,
    };
    let read = store.ledger(&q.tenant, &periods).await?;
    let rows: Vec<_> = periods.into_iter().zip(read).collect();
    let lines = usage::sum(&rows, q.by, q.user.as_ref(), group.as_deref());
    let mut total = Row::default();
    lines.iter().for_each(|l| total.add(&l.row));
    Ok(UsageReport {
        tenant: q.tenant.as_str().to_owned(),
        user: q.user.as_ref().map(|u| u.as_str().to_owned()),
        model_group: group,
        from: q.from.clone(),
        to: q.to.clone(),
        by: q.by.name(),
        lines: lines.iter().map(|l| line(l, q.by)).collect(),
        total: UsageLine::of("total".into(), "", &total),
        grouped,
    })
}

fn line(l: &Line, by: By) -> UsageLine {
    UsageLine::of(usage::label(l.start_us, by), &l.model_group, &l.row)
}

/// The lines as CSV, a header first (the header alone when there are none,
/// so a script still reads the columns).
pub fn csv(lines: &[UsageLine], out: impl std::io::Write) -> Result<(), csv::Error> {
    let mut w = csv::Writer::from_writer(out);
    for l in lines {
        w.serialize(l)?;
    }
    if lines.is_empty() {
        w.write_record(csv_header())?;
    }
    w.flush()?;
    Ok(())
}

/// µ$ as dollars, exactly: `12.345678`.
pub fn usd(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// A model group's name as reports show it. "" holds the calls whose model
/// was in no group when they were made: `all models` while the configuration
/// has no groups (`grouped` false), else `other models`.
pub fn group_label(group: &str, grouped: bool) -> &str {
    match (group, grouped) {
        ("", false) => "all models",
        ("", true) => "other models",
        (g, _) => g,
    }
}

/// The model group `model` names: a group's own name, or the group whose
/// patterns match it.
pub fn group_named(limits: &Limits, model: &str) -> Result<String, AdminError> {
    if limits.models.contains_key(model) {
        return Ok(model.to_owned());
    }
    match limits.group_of(model) {
        Some(g) => Ok(g.name.clone()),
        None => Err(AdminError::Invalid(format!(
            "{model:?} is no model group and no group's patterns match it; the ledger keeps \
             usage per model group (groups: {}; see ctxbudget models list)",
            limits.group_names()
        ))),
    }
}

/// `2026-12-01` (00:00 UTC that day) or an RFC 3339 time, as µs since the epoch.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    let text = text.trim();
    if let Ok(date) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let t = date
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc();
        return Ok(t.timestamp_micros());
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros())
        .map_err(|_| {
            format!(
                "{text:?} is not a date (2026-12-01, meaning 00:00 UTC) or an RFC 3339 time \
                 (2026-12-01T10:00:00Z)"
            )
        })
}
