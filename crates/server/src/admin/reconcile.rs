//! The provider's usage export against the ledger, per hour and model group,
//! from any store: read by `ctxbudget reconcile` (which prints it and exits 1
//! on drift) and by the admin API (`POST /admin/v1/reconcile`) and the
//! console. The arithmetic is `domain::reconcile`.

use super::AdminError;
use super::usage::parse_instant;
use crate::domain::budget::ledger::{Period, Row};
use crate::domain::reconcile::{self, Columns, Compared, Metric, Positions, compare, sum_theirs};
use crate::domain::usage::{self, By};
use crate::domain::{Limits, TenantId};
use crate::store::Store;
use serde::Serialize;
use std::collections::BTreeMap;

/// What to compare.
#[derive(Clone, Debug)]
pub struct ReconcileQuery {
    /// From (inclusive), as given: a date or an RFC 3339 time on a whole hour.
    pub from: String,
    /// To (exclusive), as given.
    pub to: String,
    /// The drift a row may have before it is flagged, as a share (0.01: 1%).
    pub max_drift: f64,
    /// Only these tenants' usage; empty: every tenant's.
    pub tenants: Vec<TenantId>,
}

/// The comparison.
#[derive(Clone, Debug, Default)]
pub struct Reconciled {
    /// Every hour and group compared, oldest first.
    pub compared: Vec<Compared>,
    /// How many tenants the ledger holds usage of in the range.
    pub tenants: usize,
    /// The configuration has model groups.
    pub grouped: bool,
}

/// The export's rows, from CSV text with a header line; `source` names it in
/// errors (`line 3`).
pub fn read_export(
    text: impl std::io::Read,
    columns: &Columns,
    source: &str,
) -> Result<Vec<reconcile::ProviderRow>, AdminError> {
    let invalid = |e: String| AdminError::Invalid(format!("{source}: {e}"));
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text);
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| invalid(e.to_string()))?
        .iter()
        .map(str::to_owned)
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let at = Positions::find(columns, &header).map_err(|e| invalid(e.to_string()))?;
    let mut rows = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|e| invalid(format!("line {}: {e}", i + 2)))?;
        let cells: Vec<&str> = record.iter().collect();
        if cells.iter().all(|c| c.trim().is_empty()) {
            continue;
        }
        rows.push(
            reconcile::provider_row(&cells, &at, i as u64 + 2)
                .map_err(|e| invalid(e.to_string()))?,
        );
    }
    Ok(rows)
}

/// `theirs` (the export's rows) against `store`'s ledger over `q`'s range;
/// `limits` name the model groups.
pub async fn reconcile<S: Store>(
    store: &S,
    limits: &Limits,
    q: &ReconcileQuery,
    theirs: Vec<reconcile::ProviderRow>,
) -> Result<Reconciled, AdminError> {
    let invalid = |what: &str, e: String| AdminError::Invalid(format!("{what}: {e}"));
    let from = parse_instant(&q.from).map_err(|e| invalid("from", e))?;
    let to = parse_instant(&q.to).map_err(|e| invalid("to", e))?;
    let hours =
        usage::periods(from, to, By::Hour).map_err(|e| AdminError::Invalid(e.to_string()))?;
    let group_of = |model: &str| match limits.models.contains_key(model) {
        true => model.to_owned(),
        false => limits
            .group_of(model)
            .map_or(String::new(), |g| g.name.clone()),
    };
    let theirs = sum_theirs(theirs, group_of, (from, to));
    // Which tenants have which of the range's hours: list once, read those.
    let mut by_tenant: BTreeMap<TenantId, Vec<Period>> = BTreeMap::new();
    for (tenant, period) in store.ledger_keys(true).await? {
        if hours.contains(&period) && (q.tenants.is_empty() || q.tenants.contains(&tenant)) {
            by_tenant.entry(tenant).or_default().push(period);
        }
    }
    let mut ours: BTreeMap<(i64, String), Row> = BTreeMap::new();
    for (tenant, periods) in &by_tenant {
        for (p, rows) in periods.iter().zip(store.ledger(tenant, periods).await?) {
            for r in rows {
                ours.entry((p.start_us(), r.group)).or_default().add(&r.row);
            }
        }
    }
    let sides = reconcile::regroup(ours, theirs, |g| limits.models.contains_key(g));
    Ok(Reconciled {
        compared: compare(&sides, q.max_drift),
        tenants: by_tenant.len(),
        grouped: !limits.models.is_empty(),
    })
}

/// One metric as JSON shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ShownMetric {
    /// The ledger's.
    pub ours: u64,
    /// The export's.
    pub theirs: u64,
    /// In percent; `null`: theirs is 0 and ours is not.
    pub drift_pct: Option<f64>,
}

impl From<Metric> for ShownMetric {
    fn from(m: Metric) -> Self {
        ShownMetric {
            ours: m.ours,
            theirs: m.theirs,
            drift_pct: m.drift.map(pct),
        }
    }
}

/// A drift allowed, `1%` or `1` (1%), `0.5%`, as a share of 1.
pub fn parse_max_drift(text: &str) -> Result<f64, String> {
    let pct: f64 = (text.trim().trim_end_matches('%').trim().parse())
        .map_err(|_| format!("{text:?}: write a percentage such as 1%"))?;
    if !(0.0..=100.0).contains(&pct) {
        return Err(format!("{text:?}: between 0% and 100%"));
    }
    Ok(pct / 100.0)
}

/// A share in percent, to two decimals.
pub fn pct(share: f64) -> f64 {
    (share * 1e4).round() / 100.0
}

/// One compared row as JSON shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ShownRow {
    /// The hour (`2026-12-01T10:00Z`).
    pub hour: String,
    /// The model group ("": calls of no group).
    pub model_group: String,
    /// In the ungrouped row: the groups whose usage was compared in it (see
    /// `domain::reconcile::regroup`).
    pub folded_groups: Vec<String>,
    /// Prompt tokens.
    pub input_tokens: ShownMetric,
    /// Of which cached, when the export has them.
    pub cached_input_tokens: Option<ShownMetric>,
    /// Written to a cache, when the export has them.
    pub cache_write_input_tokens: Option<ShownMetric>,
    /// Written to a cache for an hour, when the export has them.
    pub cache_write_1h_input_tokens: Option<ShownMetric>,
    /// Completion tokens.
    pub output_tokens: ShownMetric,
    /// Reasoning tokens, when the export has them.
    pub reasoning_tokens: Option<ShownMetric>,
    /// Cost in µ$, when the export has it.
    pub cost_micros: Option<ShownMetric>,
    /// Calls of the hour never settled.
    pub unsettled: u64,
    /// Drifts more than the maximum.
    pub flagged: bool,
}

/// The whole comparison as JSON shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ReconcileReport {
    /// From, as asked.
    pub from: String,
    /// To, as asked.
    pub to: String,
    /// The drift allowed, in percent.
    pub max_drift_pct: f64,
    /// Tenants in the ledger for the range.
    pub tenants: usize,
    /// The rows.
    pub rows: Vec<ShownRow>,
    /// How many rows drift more than allowed.
    pub flagged: usize,
}

impl Reconciled {
    /// The report of this comparison for `q`.
    pub fn report(&self, q: &ReconcileQuery) -> ReconcileReport {
        ReconcileReport {
            from: q.from.clone(),
            to: q.to.clone(),
            max_drift_pct: pct(q.max_drift),
            tenants: self.tenants,
            rows: self.compared.iter().map(shown).collect(),
            flagged: self.compared.iter().filter(|c| c.flagged).count(),
        }
    }
}

/// The hour of a compared row, as reports label it.
pub fn hour_label(c: &Compared) -> String {
    usage::label(c.hour_us, By::Hour)
}

fn shown(c: &Compared) -> ShownRow {
    ShownRow {
        hour: hour_label(c),
        model_group: c.model_group.clone(),
        folded_groups: c.folded.clone(),
        input_tokens: c.input.into(),
        cached_input_tokens: c.cached.map(Into::into),
        cache_write_input_tokens: c.cache_write.map(Into::into),
        cache_write_1h_input_tokens: c.cache_write_1h.map(Into::into),
        output_tokens: c.output.into(),
        reasoning_tokens: c.reasoning.map(Into::into),
        cost_micros: c.cost.map(Into::into),
        unsettled: c.unsettled,
        flagged: c.flagged,
    }
}
