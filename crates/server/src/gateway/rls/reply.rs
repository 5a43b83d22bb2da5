//! What ShouldRateLimit answers: a status per descriptor — its code, the limit
//! that binds it (`current_limit`, `limit_remaining`, `duration_until_reset`)
//! — the overall code (never UNKNOWN, which Envoy refuses), and, unless
//! `[envoy] headers = false`, the `x-ratelimit-*` headers of docs/http.md and
//! `retry-after` on OVER_LIMIT, which Envoy adds to its client's response.
//!
//! What is reported is the caller's own scope: the binding user or tenant
//! limit, never the global level (the upstream account's size is the
//! operator's business). A descriptor denied at the global level is
//! OVER_LIMIT with `retry-after` and no limit; a mapped one that no limit of
//! its scope binds reports `limit_remaining` 4294967295 (envoyproxy/ratelimit's
//! `unlimited: true`), and one no rule places 0 (its answer with no rule).
//! A rule under trial (a quota in shadow) is reported where no enforced limit
//! of the caller's scope applies, with the code still OK.

use crate::api::http::{self, binding_in};
use crate::domain::decision::LimitState;
use crate::domain::window::WindowKind;
use crate::domain::{Dimension, Level};
use crate::engine::ChargeOutcome;
use crate::envoy::config::core::v3::HeaderValue;
use crate::envoy::service::ratelimit::v3::RateLimitResponse;
use crate::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use crate::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};

/// A response being built, descriptor by descriptor.
pub(super) struct Answer {
    with_headers: bool,
    statuses: Vec<DescriptorStatus>,
    /// The outcome the headers come from: the first denied that shows a
    /// limit of the caller's scope (else the first denied), else the first
    /// with such a limit; with whether it was denied and shows one.
    headers_from: Option<(ChargeOutcome, bool, bool)>,
    retry_after_ms: u64,
}

impl Answer {
    pub(super) fn new(with_headers: bool) -> Self {
        Answer {
            with_headers,
            statuses: Vec::new(),
            headers_from: None,
            retry_after_ms: 0,
        }
    }

    /// A descriptor no rule places (unmapped, or of a domain not served):
    /// OK with `limit_remaining` 0 and no limit, as envoyproxy/ratelimit
    /// answers a descriptor it has no rule for. (4294967295 is its answer
    /// for an `unlimited: true` rule: here, a mapped descriptor whose tier
    /// has no limit of the caller's scope, [`Self::add`].)
    pub(super) fn unmatched(&mut self) {
        self.statuses.push(DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: 0,
            ..DescriptorStatus::default()
        });
    }

    /// A descriptor the engine decided.
    pub(super) fn add(&mut self, out: &ChargeOutcome) {
        let binding = binding(out, None);
        let denied = out.denial.is_some();
        let code = match denied {
            true => Code::OverLimit,
            false => Code::Ok,
        };
        let remaining = match (binding, denied) {
            (Some(l), _) => clamp_u32(l.remaining.max(0) as u64),
            // Denied where its size is not shown (the global level).
            (None, true) => 0,
            (None, false) => u32::MAX,
        };
        self.statuses.push(DescriptorStatus {
            code: code as i32,
            current_limit: binding.map(current_limit),
            limit_remaining: remaining,
            duration_until_reset: binding.map(|l| duration(l.reset_after_ms)),
            quota: None,
        });
        if let Some(d) = &out.denial {
            self.retry_after_ms = self.retry_after_ms.max(d.retry_after_ms);
        }
        let shown = binding.is_some();
        let replace = match &self.headers_from {
            None => shown || denied,
            Some((_, was_denied, was_shown)) => denied && (!was_denied || (shown && !was_shown)),
        };
        if replace {
            self.headers_from = Some((out.clone(), denied, shown));
        }
    }

    /// The response: OVER_LIMIT if any descriptor is.
    pub(super) fn finish(self) -> RateLimitResponse {
        let over = self
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit as i32);
        let mut headers = Vec::new();
        if self.with_headers {
            if let Some((out, _, _)) = &self.headers_from {
                headers = rate_limit_headers(out);
            }
            // None when retrying cannot help (more than a limit holds).
            if over && self.retry_after_ms > 0 {
                headers.push(header("retry-after", self.retry_after_ms.div_ceil(1000)));
            }
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses: self.statuses,
            response_headers_to_add: headers,
            ..RateLimitResponse::default()
        }
    }
}

/// The limit of the caller's own scope that binds a descriptor (of
/// `dimension`, when given): none when the global level denied it (its size
/// is not shown); else the enforced limits', or when none of the caller's
/// scope applies and nothing denied, those of the quota in shadow.
fn binding(out: &ChargeOutcome, dimension: Option<Dimension>) -> Option<&LimitState> {
    let denial = out.denial.as_ref();
    if denial.is_some_and(|d| d.level == Some(Level::Global)) {
        return None;
    }
    binding_in(&out.limits, denial, dimension).or_else(|| match denial {
        None => binding_in(&out.shadow_limits, None, dimension),
        Some(_) => None,
    })
}

/// `current_limit` of a limit: its name in words, its rate in Envoy's units.
/// A period that is no whole unit is stated per the largest unit within it
/// (100 per 5 minutes: 20 per MINUTE); the name keeps it exact.
fn current_limit(l: &LimitState) -> RateLimit {
    let group = l
        .model_group
        .as_ref()
        .map_or(String::new(), |g| format!(" of model group {}", g.name));
    let (per, unit, rate) = match l.window {
        Some(w) => {
            let unit = match w.kind {
                WindowKind::Day => Unit::Day,
                WindowKind::Week => Unit::Week,
                WindowKind::Month => Unit::Month,
            };
            (w.to_string(), unit, l.limit)
        }
        None => {
            let (unit, secs) = UNITS
                .iter()
                .rev()
                .find(|(_, secs)| *secs <= l.period_secs)
                .copied()
                .unwrap_or(UNITS[0]);
            let rate = (u128::from(l.limit) * u128::from(secs) / u128::from(l.period_secs.max(1)))
                .max(1) as u64;
            let label = crate::domain::decision::period_label(l.period_secs);
            (label, unit, rate)
        }
    };
    RateLimit {
        name: format!(
            "{} {}{group}: {} per {per}",
            l.level.as_str(),
            l.dimension.as_str(),
            l.limit
        ),
        requests_per_unit: clamp_u32(rate),
        unit: unit as i32,
    }
}

/// Envoy's units, shortest first.
const UNITS: [(Unit, u64); 5] = [
    (Unit::Second, 1),
    (Unit::Minute, 60),
    (Unit::Hour, 3_600),
    (Unit::Day, 86_400),
    (Unit::Week, 604_800),
];

/// The OpenAI-style headers of docs/http.md for requests and tokens.
fn rate_limit_headers(out: &ChargeOutcome) -> Vec<HeaderValue> {
    http::rate_limit_headers(|dimension| binding(out, Some(dimension)))
        .into_iter()
        .map(|(key, value)| header(key, value))
        .collect()
}

fn header(key: &str, value: impl std::fmt::Display) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value: value.to_string(),
        raw_value: Vec::new(),
    }
}

fn duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(period_secs: u64, window: Option<crate::domain::window::Window>) -> LimitState {
        LimitState {
            level: crate::domain::Level::Tenant,
            model_group: None,
            dimension: Dimension::Requests,
            period_secs,
            window,
            limit: 100,
            remaining: -5,
            reset_after_ms: 1500,
        }
    }

    #[test]
    fn limits_are_stated_in_envoys_units_and_named_exactly() {
        let five_minutes = current_limit(&state(300, None));
        assert_eq!(
            (five_minutes.requests_per_unit, five_minutes.unit()),
            (20, Unit::Minute)
        );
        assert_eq!(five_minutes.name, "tenant requests: 100 per 5m");
        let hour = current_limit(&state(3600, None));
        assert_eq!((hour.requests_per_unit, hour.unit()), (100, Unit::Hour));
        let month = crate::domain::window::Window {
            kind: WindowKind::Month,
            tz: crate::domain::window::parse_zone("UTC").unwrap(),
        };
        let monthly = current_limit(&state(0, Some(month)));
        assert_eq!(
            (monthly.requests_per_unit, monthly.unit()),
            (100, Unit::Month)
        );
        let s = state(60, None);
        let out = ChargeOutcome {
            denial: None,
            limits: vec![s],
            shadow_denial: None,
            shadow_limits: Vec::new(),
            degraded: false,
        };
        let mut answer = Answer::new(true);
        answer.add(&out);
        let r = answer.finish();
        assert_eq!(r.statuses[0].limit_remaining, 0, "debt shows as 0");
        let reset = r.statuses[0].duration_until_reset.unwrap();
        assert_eq!((reset.seconds, reset.nanos), (1, 500_000_000));
        let h: Vec<(&str, &str)> = r
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            h,
            [
                ("x-ratelimit-limit-requests", "100"),
                ("x-ratelimit-remaining-requests", "0"),
                ("x-ratelimit-reset-requests", "1.5s")
            ]
        );
    }
}
