//! Reconciliation: the provider's usage export against the ledger, per hour
//! and model group. Pure: reading the provider's rows from a CSV, summing
//! both sides, and the drift of each metric; the command reads the files and
//! the store (`ctxbudget reconcile`).
//!
//! Both sides are summed per (hour, model group): the provider's model names
//! map to groups by the groups' patterns (a name that is a group's own name
//! maps to it; one matching no group goes to the ungrouped row, ""). The
//! ledger recorded each call under the groups of its time, the provider's
//! rows are grouped by today's, so [`regroup`] lets the two meet where the
//! groups changed in between. A metric's drift is |ours − theirs| ÷ theirs;
//! when theirs is 0 it is 0 if ours is too, else unbounded. A row is flagged
//! when any metric it has on the provider's side drifts more than the allowed
//! share.

mod export;

pub use export::{Columns, Positions, ProviderRow, parse_usd, provider_row};

use super::ledger::Row;
use std::collections::{BTreeMap, BTreeSet};

/// A provider export or a reconciliation setting that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ReconcileError(pub String);

const HOUR_US: i64 = 3_600_000_000;

/// The provider's usage in one hour for one model group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Theirs {
    /// Input (prompt) tokens, cached ones included.
    pub input_tokens: u64,
    /// Of which cached (`None`: the export has no such column).
    pub cached_input_tokens: Option<u64>,
    /// Of the input, written to the cache for 5 minutes (`None`: no such column).
    pub cache_write_input_tokens: Option<u64>,
    /// Of the input, written to the cache for an hour (`None`: no such column).
    pub cache_write_1h_input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: u64,
    /// Of the output, reasoning (`None`: no such column).
    pub reasoning_tokens: Option<u64>,
    /// What it cost, µ$ (`None`: no cost column).
    pub cost_micros: Option<u64>,
}

impl Theirs {
    fn add(&mut self, o: &Theirs) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        self.cached_input_tokens = add(self.cached_input_tokens, o.cached_input_tokens);
        self.cache_write_input_tokens =
            add(self.cache_write_input_tokens, o.cache_write_input_tokens);
        self.cache_write_1h_input_tokens = add(
            self.cache_write_1h_input_tokens,
            o.cache_write_1h_input_tokens,
        );
        self.reasoning_tokens = add(self.reasoning_tokens, o.reasoning_tokens);
        self.cost_micros = add(self.cost_micros, o.cost_micros);
    }
}

/// One metric of one row: ours, theirs, and the drift (a share; `None`:
/// unbounded, theirs 0 and ours not).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Metric {
    /// The ledger's figure.
    pub ours: u64,
    /// The provider's figure.
    pub theirs: u64,
    /// |ours − theirs| ÷ theirs.
    pub drift: Option<f64>,
}

impl Metric {
    fn of(ours: u64, theirs: u64) -> Metric {
        let drift = match (ours, theirs) {
            (0, 0) => Some(0.0),
            (_, 0) => None,
            (o, t) => Some(o.abs_diff(t) as f64 / t as f64),
        };
        Metric {
            ours,
            theirs,
            drift,
        }
    }

    fn over(&self, max: f64) -> bool {
        self.drift.is_none_or(|d| d > max)
    }
}

/// One compared row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compared {
    /// The hour's start (µs).
    pub hour_us: i64,
    /// The model group ("": none).
    pub model_group: String,
    /// In the ungrouped row: the groups whose usage [`regroup`] compared in it.
    pub folded: Vec<String>,
    /// Prompt tokens vs input tokens.
    pub input: Metric,
    /// Cached (when the export has them).
    pub cached: Option<Metric>,
    /// Written to the cache for 5 minutes (when the export has them).
    pub cache_write: Option<Metric>,
    /// Written to the cache for an hour (when the export has them).
    pub cache_write_1h: Option<Metric>,
    /// Completion vs output tokens.
    pub output: Metric,
    /// Reasoning (when the export has them).
    pub reasoning: Option<Metric>,
    /// Cost, µ$ (when the export has it).
    pub cost: Option<Metric>,
    /// Reservations the ledger holds unsettled in the hour (their usage
    /// never came: a cause of drift).
    pub unsettled: u64,
    /// Some metric drifts more than allowed.
    pub flagged: bool,
}

/// Both sides per (hour, model group), ready to compare.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sides {
    /// The ledger's hourly rows.
    pub ours: BTreeMap<(i64, String), Row>,
    /// The provider's, summed.
    pub theirs: BTreeMap<(i64, String), Theirs>,
    /// Per hour: the groups whose rows were moved into its ungrouped row.
    pub folded: BTreeMap<i64, BTreeSet<String>>,
}

/// Lets the two sides meet where the model groups changed between a call
/// and the reconciliation; both moves go to the hour's ungrouped row (""):
/// - the ledger's row of a group the configuration no longer has (`known`
///   says which it has): today the provider's rows of those models cannot
///   be grouped under it;
/// - the provider's row of a group the ledger has no row for in that hour,
///   when the ledger has an ungrouped row then: the calls were made before
///   the group existed, and recorded as ungrouped.
///
/// Usage that reached only one side still drifts: the ungrouped row then
/// differs by it (and names the groups moved into it).
pub fn regroup(
    ours: BTreeMap<(i64, String), Row>,
    theirs: BTreeMap<(i64, String), Theirs>,
    known: impl Fn(&str) -> bool,
) -> Sides {
    let mut sides = Sides::default();
    for ((hour, group), row) in ours {
        let group = match group.is_empty() || known(&group) {
            true => group,
            false => {
                sides.folded.entry(hour).or_default().insert(group);
                String::new()
            }
        };
        sides.ours.entry((hour, group)).or_default().add(&row);
    }
    for ((hour, group), usage) in theirs {
        let recorded_ungrouped = !group.is_empty()
            && !sides.ours.contains_key(&(hour, group.clone()))
            && sides.ours.contains_key(&(hour, String::new()));
        let group = match recorded_ungrouped {
            false => group,
            true => {
                sides.folded.entry(hour).or_default().insert(group);
                String::new()
            }
        };
        sides.theirs.entry((hour, group)).or_default().add(&usage);
    }
    sides
}

/// Compares the ledger's hourly rows with the provider's, flagging drift
/// above `max_drift` (a share: 0.01).
pub fn compare(sides: &Sides, max_drift: f64) -> Vec<Compared> {
    let (ours, theirs) = (&sides.ours, &sides.theirs);
    let keys: BTreeSet<&(i64, String)> = ours.keys().chain(theirs.keys()).collect();
    keys.into_iter()
        .map(|key| {
            let o = ours.get(key).copied().unwrap_or_default();
            let t = theirs.get(key).copied().unwrap_or_default();
            let n = |v: f64| v.max(0.0) as u64;
            // An optional column, compared when the export has it. A side
            // with no rows at all: every column it would have had is 0.
            let none_of_theirs = !theirs.contains_key(key);
            let optional = |ours: f64, theirs: Option<u64>| {
                (theirs.is_some() || none_of_theirs)
                    .then(|| Metric::of(n(ours), theirs.unwrap_or(0)))
            };
            let input = Metric::of(n(o.prompt_tokens), t.input_tokens);
            let output = Metric::of(n(o.completion_tokens), t.output_tokens);
            let cached = optional(o.cached_prompt_tokens, t.cached_input_tokens);
            let cache_write = optional(o.cache_write_prompt_tokens, t.cache_write_input_tokens);
            let cache_write_1h = optional(
                o.cache_write_1h_prompt_tokens,
                t.cache_write_1h_input_tokens,
            );
            let reasoning = optional(o.reasoning_tokens, t.reasoning_tokens);
            let cost = optional(o.cost_micros, t.cost_micros);
            let flagged = [input, output].iter().any(|m| m.over(max_drift))
                || [cached, cache_write, cache_write_1h, reasoning, cost]
                    .iter()
                    .flatten()
                    .any(|m| m.over(max_drift));
            let folded = match key.1.is_empty() {
                true => sides.folded.get(&key.0),
                false => None,
            };
            Compared {
                hour_us: key.0,
                model_group: key.1.clone(),
                folded: folded.map_or(Vec::new(), |f| f.iter().cloned().collect()),
                input,
                cached,
                cache_write,
                cache_write_1h,
                output,
                reasoning,
                cost,
                unsettled: n(o.unsettled),
                flagged,
            }
        })
        .collect()
}

/// Sums provider rows per (hour, group), `group_of` naming a model's group,
/// keeping hours in `[from_us, to_us)`.
pub fn sum_theirs(
    rows: impl IntoIterator<Item = ProviderRow>,
    group_of: impl Fn(&str) -> String,
    (from_us, to_us): (i64, i64),
) -> BTreeMap<(i64, String), Theirs> {
    let mut out: BTreeMap<(i64, String), Theirs> = BTreeMap::new();
    for r in rows
        .into_iter()
        .filter(|r| (from_us..to_us).contains(&r.hour_us))
    {
        out.entry((r.hour_us, group_of(&r.model)))
            .or_default()
            .add(&r.usage);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drift_over_the_limit_flags_the_row_and_a_missing_side_counts_as_zero() {
        let ours = BTreeMap::from([
            (
                (0, "g".to_string()),
                Row {
                    prompt_tokens: 1_000.0,
                    completion_tokens: 200.0,
                    cost_micros: 3_000.0,
                    ..Row::default()
                },
            ),
            ((HOUR_US, "g".to_string()), Row::default()),
        ]);
        let theirs = BTreeMap::from([
            (
                (0, "g".to_string()),
                Theirs {
                    input_tokens: 1_005,
                    output_tokens: 200,
                    cost_micros: Some(3_000),
                    ..Theirs::default()
                },
            ),
            (
                (2 * HOUR_US, "g".to_string()),
                Theirs {
                    input_tokens: 10,
                    ..Theirs::default()
                },
            ),
        ]);
        let sides = regroup(ours, theirs, |_| true);
        let rows = compare(&sides, 0.01);
        assert_eq!(rows.len(), 3);
        assert!(!rows[0].flagged, "0.5% is within 1%");
        assert_eq!(rows[0].cached, None, "no cached column in the export");
        assert!(!rows[1].flagged, "nothing on either side");
        assert!(rows[2].flagged, "theirs only: 100% drift");
        assert!(compare(&sides, 0.001)[0].flagged, "0.5% is over 0.1%");
    }

    #[test]
    fn usage_recorded_under_other_groups_meets_in_the_ungrouped_row() {
        let row = |prompt: f64| Row {
            prompt_tokens: prompt,
            ..Row::default()
        };
        let billed = |input: u64| Theirs {
            input_tokens: input,
            cached_input_tokens: Some(0),
            cost_micros: Some(0),
            ..Theirs::default()
        };
        let key = |hour: i64, g: &str| (hour * HOUR_US, g.to_string());
        let ours = BTreeMap::from([
            // Hour 0: gpt-4o had no group yet; hour 1: it had.
            (key(0, ""), row(1_000.0)),
            (key(1, "gpt-4o"), row(500.0)),
            // Hour 2: a group deleted since.
            (key(2, "old"), row(70.0)),
            // Hour 3: only other models reached the ledger.
            (key(3, ""), row(10.0)),
        ]);
        let theirs = BTreeMap::from([
            (key(0, "gpt-4o"), billed(1_000)),
            (key(1, "gpt-4o"), billed(500)),
            (key(2, ""), billed(70)),
            (key(3, ""), billed(10)),
            (key(3, "gpt-4o"), billed(99)),
            // Hour 4: no ungrouped usage in the ledger to meet.
            (key(4, "gpt-4o"), billed(5)),
        ]);
        let sides = regroup(ours, theirs, |g| g == "gpt-4o");
        let compared = compare(&sides, 0.01);
        let rows: Vec<(i64, &str, Vec<&str>, bool)> = compared
            .iter()
            .map(|c| {
                let folded = c.folded.iter().map(String::as_str).collect();
                (
                    c.hour_us / HOUR_US,
                    c.model_group.as_str(),
                    folded,
                    c.flagged,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                (0, "", vec!["gpt-4o"], false),
                (1, "gpt-4o", vec![], false),
                (2, "", vec!["old"], false),
                (3, "", vec!["gpt-4o"], true),
                (4, "gpt-4o", vec![], true),
            ],
            "usage that reached one side only still drifts"
        );
    }
}
