//! Usage reports from the ledger (`ctxbudget usage`, `ctxbudget reconcile`):
//! which ledger periods a time range covers, and their rows summed by hour, UTC
//! day or UTC month, per model group (and for one user). Pure: the caller
//! reads the rows from the store.
//!
//! A range is `[from, to)`. With `--by hour` it reads hourly rows and must
//! start and end on whole hours; by day or month it reads daily rows (kept
//! longer, and the only rows with users) and must start and end at 00:00 UTC.

use super::ledger::{LedgerRow, Period, Row};
use crate::UserId;
use chrono::{DateTime, Datelike, NaiveDate, Utc};
use std::collections::BTreeMap;

/// A usage range, or its time, that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RangeError(String);

/// How rows are summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// Hour by hour (the hourly rows).
    Hour,
    /// UTC day by day (the daily rows).
    Day,
    /// UTC month by month (the daily rows).
    Month,
}

impl By {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            By::Hour => "hour",
            By::Day => "day",
            By::Month => "month",
        }
    }
}

const HOUR_US: i64 = 3_600_000_000;
const DAY_US: i64 = 86_400_000_000;
/// The most periods one report reads (400 days of hours is 9,600).
pub const MAX_PERIODS: usize = 20_000;

/// The ledger periods of `[from_us, to_us)` summed `by`: hours, or days.
pub fn periods(from_us: i64, to_us: i64, by: By) -> Result<Vec<Period>, RangeError> {
    if to_us <= from_us {
        return Err(RangeError(format!(
            "--to ({}) must come after --from ({}); --to is exclusive",
            label_us(to_us),
            label_us(from_us)
        )));
    }
    let (step, unit) = match by {
        By::Hour => (HOUR_US, "a whole hour (10:00:00Z)"),
        By::Day | By::Month => (DAY_US, "00:00 UTC (a date such as 2026-12-01)"),
    };
    for (flag, t) in [("--from", from_us), ("--to", to_us)] {
        if t.rem_euclid(step) != 0 {
            return Err(RangeError(format!(
                "{flag} {} is not on {unit}: by {by:?} rows cover whole {}s",
                label_us(t),
                if step == HOUR_US { "hour" } else { "day" },
            )));
        }
    }
    let n = ((to_us - from_us) / step) as usize;
    if n > MAX_PERIODS {
        return Err(RangeError(format!(
            "the range covers {n} rows per model group, more than {MAX_PERIODS}: narrow it"
        )));
    }
    let first = from_us.div_euclid(step);
    Ok((first..first + n as i64)
        .map(|i| match by {
            By::Hour => Period::Hour(i),
            By::Day | By::Month => Period::Day(i),
        })
        .collect())
}

/// One line of a report: a period and model group, and the sum of its rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// When the line's period starts (µs).
    pub start_us: i64,
    /// The model group ("": none).
    pub model_group: String,
    /// The sums.
    pub row: Row,
}

/// Sums `rows` (each period's rows, as the store reads them) by `by` and
/// model group, keeping only `user`'s rows when given (daily rows only) and
/// only model group `group` when given. Lines in time order, then by group.
pub fn sum(
    rows: &[(Period, Vec<LedgerRow>)],
    by: By,
    user: Option<&UserId>,
    group: Option<&str>,
) -> Vec<Line> {
    let mut lines: BTreeMap<(i64, String), Row> = BTreeMap::new();
    for (period, cells) in rows {
        for cell in cells {
            if user.is_some() && cell.user.as_ref() != user {
                continue;
            }
            if group.is_some_and(|want| want != cell.group) {
                continue;
            }
            let start = bucket_start(period.start_us(), by);
            lines
                .entry((start, cell.group.clone()))
                .or_default()
                .add(&cell.row);
        }
    }
    lines
        .into_iter()
        .map(|((start_us, model_group), row)| Line {
            start_us,
            model_group,
            row,
        })
        .collect()
}

/// The start of the hour, day or UTC month `t` falls in.
fn bucket_start(t: i64, by: By) -> i64 {
    match by {
        By::Hour => t - t.rem_euclid(HOUR_US),
        By::Day => t - t.rem_euclid(DAY_US),
        By::Month => {
            let d = utc(t);
            NaiveDate::from_ymd_opt(d.year(), d.month(), 1)
                .expect("the 1st exists")
                .and_hms_opt(0, 0, 0)
                .expect("midnight exists")
                .and_utc()
                .timestamp_micros()
        }
    }
}

fn utc(t: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t).expect("a time within chrono's range")
}

/// A period's start as a report shows it: `2026-12-01T10:00Z` by hour,
/// `2026-12-01` by day, `2026-12` by month.
pub fn label(start_us: i64, by: By) -> String {
    let t = utc(start_us);
    match by {
        By::Hour => t.format("%Y-%m-%dT%H:%MZ").to_string(),
        By::Day => t.format("%Y-%m-%d").to_string(),
        By::Month => t.format("%Y-%m").to_string(),
    }
}

fn label_us(t: i64) -> String {
    utc(t).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// `hour`, `day` or `month` (the CLI's `--by`, the admin API's `by`).
impl std::str::FromStr for By {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hour" => Ok(By::Hour),
            "day" => Ok(By::Day),
            "month" => Ok(By::Month),
            _ => Err(format!("{s:?}: sum by hour, day or month")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(group: &str, user: Option<&UserId>, row: Row) -> LedgerRow {
        LedgerRow {
            group: group.into(),
            user: user.cloned(),
            row,
        }
    }

    /// 00:00 UTC on `date`, µs since the epoch.
    fn midnight(date: &str) -> i64 {
        let date = NaiveDate::parse_from_str(date, "%Y-%m-%d").unwrap();
        date.and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp_micros()
    }

    #[test]
    fn ranges_must_be_whole_periods() {
        let day = midnight("2026-12-01");
        let next = midnight("2026-12-02");
        assert_eq!(periods(day, next, By::Hour).unwrap().len(), 24);
        assert_eq!(
            periods(day, next, By::Day).unwrap(),
            [Period::Day(day / DAY_US)]
        );
        let half = day + 10 * HOUR_US + HOUR_US / 2;
        let err = periods(half, next, By::Hour).unwrap_err().0;
        assert!(
            err.contains("--from") && err.contains("whole hour"),
            "{err}"
        );
        assert!(
            periods(day + HOUR_US, next, By::Day)
                .unwrap_err()
                .0
                .contains("00:00 UTC")
        );
        assert!(
            periods(next, day, By::Day)
                .unwrap_err()
                .0
                .contains("exclusive")
        );
    }

    #[test]
    fn rows_sum_by_month_and_group_and_filter_by_user() {
        let alice = UserId::parse("alice").unwrap();
        let row = |n: f64| Row {
            requests: n,
            cost_micros: 10.0 * n,
            ..Row::default()
        };
        let nov30 = midnight("2026-11-30") / DAY_US;
        let dec1 = midnight("2026-12-01") / DAY_US;
        let rows = vec![
            (Period::Day(nov30), vec![cell("g", Some(&alice), row(1.0))]),
            (
                Period::Day(dec1),
                vec![
                    cell("g", Some(&alice), row(2.0)),
                    cell("g", None, row(4.0)),
                    cell("", None, row(8.0)),
                ],
            ),
        ];
        let all = sum(&rows, By::Month, None, None);
        let shown: Vec<(String, &str, f64)> = all
            .iter()
            .map(|l| {
                (
                    label(l.start_us, By::Month),
                    l.model_group.as_str(),
                    l.row.requests,
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("2026-11".to_string(), "g", 1.0),
                ("2026-12".to_string(), "", 8.0),
                ("2026-12".to_string(), "g", 6.0)
            ]
        );
        let hers = sum(&rows, By::Day, Some(&alice), Some("g"));
        assert_eq!(hers.len(), 2);
        assert_eq!(hers[1].row.cost_micros, 20.0);
    }
}
