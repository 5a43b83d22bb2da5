//! Rates as written — `{ limit = 60, period = "1m" }` or a calendar window —
//! and their periods, with their conversion into domain rates.

use crate::domain::alert::Thresholds;
use crate::domain::price::{MAX_SPEND_MICROS, usd_to_micros};
use crate::domain::window::{Window, WindowKind, parse_zone};
use crate::domain::{Dimension, LimitsError, Rate};
use serde::{Deserialize, Serialize};

/// One rate as written: `{ limit = 60, period = "1m" }`, or per calendar
/// window: `{ limit = 1000000, window = "month", timezone = "Asia/Bangkok" }`;
/// a spend limit in USD: `{ limit_usd = 500, window = "month" }`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateSection {
    /// Units per period (or window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// A spend limit: USD per period (or window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<f64>,
    /// `"30s"`, `"1m"`, `"1h"`, `"1d"` or seconds: a rolling period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    /// `"day"`, `"week"` or `"month"`: a calendar window instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The window's IANA time zone (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Fractions of the limit to alert at: `[0.8, 0.95, 1.0]` (docs/operations.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alert_at: Vec<f64>,
}

impl RateSection {
    /// The limit as written: `limit`, or for spend `limit_usd` in µ$.
    fn limit_of(&self, field: &str, dimension: Dimension) -> Result<u64, LimitsError> {
        let err =
            |name: &str, problem: String| LimitsError::new(format!("{field}.{name}"), problem);
        Ok(match (dimension.is_priced(), self.limit, self.limit_usd) {
            (true, None, Some(usd)) => {
                usd_to_micros(&format!("{field}.limit_usd"), usd, MAX_SPEND_MICROS)?
            }
            (false, Some(limit), None) => limit,
            (true, _, _) => {
                return Err(err(
                    "limit_usd",
                    "is required: a spend limit is written in USD (limit_usd = 500)".into(),
                ));
            }
            (false, _, Some(_)) => {
                return Err(err(
                    "limit_usd",
                    format!(
                        "only spend limits are in USD: write {} limits as limit = N",
                        dimension.as_str()
                    ),
                ));
            }
            (false, None, None) => {
                return Err(err(
                    "limit",
                    "is required: how many per period (limit = 60)".into(),
                ));
            }
        })
    }

    /// The domain rate of `dimension` (a spend limit in µ$); `field` names
    /// it in errors.
    pub(crate) fn to_domain(&self, field: &str, dimension: Dimension) -> Result<Rate, LimitsError> {
        let err =
            |name: &str, problem: String| LimitsError::new(format!("{field}.{name}"), problem);
        let limit = self.limit_of(field, dimension)?;
        let alert_at = Thresholds::new(&self.alert_at).map_err(|p| err("alert_at", p))?;
        match (&self.period, &self.window) {
            (Some(period), None) => {
                if self.timezone.is_some() {
                    return Err(err(
                        "timezone",
                        "a time zone goes with a calendar window (window = \"day\", \"week\" \
                         or \"month\"), not a rolling period"
                            .into(),
                    ));
                }
                let period_secs = period.seconds().map_err(|p| err("period", p.to_string()))?;
                Ok(Rate {
                    limit,
                    period_secs,
                    window: None,
                    alert_at,
                })
            }
            (None, Some(kind)) => {
                let kind = WindowKind::parse(kind).ok_or_else(|| {
                    err(
                        "window",
                        format!("{kind:?} is not a window; use \"day\", \"week\" or \"month\""),
                    )
                })?;
                let zone = self.timezone.as_deref().unwrap_or("UTC");
                let tz = parse_zone(zone).ok_or_else(|| {
                    err(
                        "timezone",
                        format!(
                            "{zone:?} is not an IANA time zone (e.g. \"UTC\", \"Asia/Bangkok\")"
                        ),
                    )
                })?;
                Ok(Rate {
                    limit,
                    period_secs: 0,
                    window: Some(Window { kind, tz }),
                    alert_at,
                })
            }
            (Some(_), Some(_)) => Err(err(
                "window",
                "give a rolling period or a calendar window, not both".into(),
            )),
            (None, None) => Err(err(
                "period",
                "is required: a rolling period (\"1m\", \"1d\") or a calendar window \
                 (window = \"day\", \"week\" or \"month\")"
                    .into(),
            )),
        }
    }

    /// A domain rate of `dimension` as written.
    pub fn of(rate: &Rate, dimension: Dimension) -> Self {
        let alert_at = rate.alert_at.iter().collect();
        let (limit, limit_usd) = match dimension.is_priced() {
            true => (None, Some(rate.limit as f64 / 1e6)),
            false => (Some(rate.limit), None),
        };
        match rate.window {
            Some(w) => RateSection {
                limit,
                limit_usd,
                period: None,
                window: Some(w.kind.as_str().into()),
                timezone: Some(w.tz.name().into()),
                alert_at,
            },
            None => RateSection {
                limit,
                limit_usd,
                period: Some(Period::Text(crate::domain::decision::period_label(
                    rate.period_secs,
                ))),
                window: None,
                timezone: None,
                alert_at,
            },
        }
    }
}

/// A period as written: a number of seconds or a string with a unit.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Period {
    /// Seconds.
    Secs(u64),
    /// `"<n><s|m|h|d>"`.
    Text(String),
}

impl Period {
    /// The period in seconds, or what is wrong with it.
    pub fn seconds(&self) -> Result<u64, PeriodError> {
        match self {
            Period::Secs(s) => Ok(*s),
            Period::Text(t) => period_seconds(t),
        }
    }
}

/// A period that does not parse; the message quotes it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// No number where one must be.
    #[error("{0:?} is not a period like \"30s\", \"1m\", \"1h\" or \"1d\"")]
    NotAPeriod(String),
    /// A unit other than s, m, h or d.
    #[error("{0:?} has an unknown unit; use s, m, h or d")]
    UnknownUnit(String),
    /// More seconds than a u64 holds.
    #[error("{0:?} is too long")]
    TooLong(String),
}

/// Parses `"90s"`, `"1m"`, `"2h"`, `"1d"` or a bare number of seconds.
pub fn period_seconds(text: &str) -> Result<u64, PeriodError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| PeriodError::NotAPeriod(text.into()))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(PeriodError::UnknownUnit(text.into())),
    };
    n.checked_mul(scale)
        .ok_or_else(|| PeriodError::TooLong(text.into()))
}

/// Written rates of `dimension` as domain rates; `path` names the list in errors.
pub fn rates(
    path: &str,
    dimension: Dimension,
    rates: &[RateSection],
) -> Result<Vec<Rate>, LimitsError> {
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| r.to_domain(&format!("{path}[{i}]"), dimension))
        .collect()
}
