//! One queued alert as its receiver reads it: the JSON body of the webhook
//! POST, built from the stored record, the tenant's queue and the limits of
//! the day (a model group's name from its tag).

use crate::domain::alert::{AlertRecord, LimitOf};
use crate::domain::model::group_tag;
use crate::domain::{Dimension, Level, Limits};
use crate::store::QueuedAlert;
use crate::store::keys::Keys;
use serde::Serialize;

/// The webhook's body.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Event {
    /// The same on every try of one crossing: a receiver drops repeats by it.
    pub event_id: String,
    /// `threshold_crossed` (or `test` from `ctxbudget alerts test`).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The tenant whose call crossed it (at the global level: whose call made
    /// the upstream account cross).
    pub tenant: Option<String>,
    /// The user, for a user's or a session's limit.
    pub user: Option<String>,
    /// The session, for a session's limit.
    pub session: Option<String>,
    /// `global`, `tenant`, `user` or `session`.
    pub level: &'static str,
    /// The model group whose limit it is (`null`: a limit on all models).
    pub model_group: Option<String>,
    /// The limit.
    pub limit: LimitShown,
    /// What the limit had used after the call that crossed (µ$ for spend;
    /// reservations in flight count, and use beyond the limit is debt).
    pub usage: f64,
    /// The threshold crossed, a fraction of the limit.
    pub threshold: f64,
    /// A calendar window's start (RFC 3339, UTC); `null` for a rolling limit.
    pub window_start: Option<String>,
    /// When it crossed (RFC 3339, UTC).
    pub timestamp: String,
    /// When it crossed (µs since the epoch).
    #[serde(skip)]
    pub at_us: f64,
}

/// The limit crossed, as configured.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LimitShown {
    /// `requests`, `tokens`, `input_tokens`, `output_tokens` or `spend`.
    pub dimension: &'static str,
    /// Units per period or window (µ$ for spend).
    pub limit: u64,
    /// A rolling period, in seconds.
    pub period_secs: Option<u64>,
    /// `day`, `week` or `month`, for a calendar window.
    pub window: Option<&'static str>,
}

impl Event {
    /// The event of `alert`, or `None` when its record cannot be read.
    pub fn of(alert: &QueuedAlert, keys: &Keys, limits: &Limits) -> Option<Event> {
        let rec = AlertRecord::decode(&alert.record)?;
        let level = keys.parse_level(&rec.level_key)?;
        let tenant = keys.parse_alert_queue(&alert.queue);
        let c = rec.crossing;
        let of = LimitOf::of(c.bucket_id);
        let model_group = match of.group_tag {
            0 => None,
            tag => Some(
                limits
                    .models
                    .keys()
                    .find(|name| group_tag(name) == tag)
                    .cloned()
                    .unwrap_or_else(|| format!("(a model group since removed, tag {tag})")),
            ),
        };
        Some(Event {
            event_id: alert.id.clone(),
            kind: "threshold_crossed",
            tenant: level.tenant.or(tenant).map(|t| t.as_str().to_owned()),
            user: level.user.map(|u| u.as_str().to_owned()),
            session: level.session.map(|s| s.as_str().to_owned()),
            level: level.level.as_str(),
            model_group,
            limit: LimitShown {
                dimension: of.dimension.as_str(),
                limit: c.limit as u64,
                period_secs: of.period_secs,
                window: of.window.map(|w| w.as_str()),
            },
            usage: c.used,
            threshold: c.threshold,
            window_start: (c.window_start_us > 0.0).then(|| rfc3339(c.window_start_us)),
            timestamp: rfc3339(rec.at_us),
            at_us: rec.at_us,
        })
    }

    /// A made-up event for `ctxbudget alerts test`, sent now.
    pub fn test(now_us: i64) -> Event {
        Event {
            event_id: format!("test-{now_us}"),
            kind: "test",
            tenant: Some("ctxbudget-test".into()),
            user: None,
            session: None,
            level: Level::Tenant.as_str(),
            model_group: None,
            limit: LimitShown {
                dimension: Dimension::Spend.as_str(),
                limit: 100_000_000,
                period_secs: None,
                window: Some("month"),
            },
            usage: 80_000_000.0,
            threshold: 0.8,
            window_start: None,
            timestamp: rfc3339(now_us as f64),
            at_us: now_us as f64,
        }
    }
}

/// µs since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(us: f64) -> String {
    chrono::DateTime::from_timestamp_micros(us as i64).map_or_else(String::new, |t| {
        t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
    })
}
