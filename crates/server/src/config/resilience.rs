//! `[resilience]`: what the service does when the store fails — the failure
//! policy and the circuit breaker's settings — as written, and validated into
//! the engine's [`FailurePolicy`] and [`BreakerSettings`].

use super::input::within;
use crate::domain::LimitsError;
use crate::engine::{BreakerSettings, FailurePolicy};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `[resilience]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResilienceSection {
    /// What happens when the store cannot answer.
    #[serde(default)]
    pub policy: FailurePolicy,
    /// Replicas sharing the store: `local` divides every limit by this.
    #[serde(default = "one")]
    pub replicas: u64,
    /// The breaker's sliding window.
    #[serde(default = "default_breaker_window_ms")]
    pub breaker_window_ms: u64,
    /// Calls in the window before it may open.
    #[serde(default = "default_breaker_min_calls")]
    pub breaker_min_calls: u32,
    /// Failure share that opens it.
    #[serde(default = "default_breaker_failure_rate")]
    pub breaker_failure_rate: f64,
    /// How long it stays open before the store is probed (and between probes).
    #[serde(default = "default_breaker_cool_down_ms")]
    pub breaker_cool_down_ms: u64,
    /// Probe calls at once while half-open.
    #[serde(default = "default_breaker_probes")]
    pub breaker_probes: u32,
    /// Consecutive probe successes that close it.
    #[serde(default = "default_breaker_probes")]
    pub breaker_close_after: u32,
}

fn one() -> u64 {
    1
}
fn default_breaker_window_ms() -> u64 {
    10_000
}
fn default_breaker_min_calls() -> u32 {
    20
}
fn default_breaker_failure_rate() -> f64 {
    0.5
}
fn default_breaker_cool_down_ms() -> u64 {
    1_000
}
fn default_breaker_probes() -> u32 {
    3
}

impl ResilienceSection {
    /// The breaker's settings, each checked against its range.
    pub fn breaker(&self) -> Result<BreakerSettings, LimitsError> {
        within("resilience.replicas", self.replicas, 1, 10_000)?;
        within(
            "resilience.breaker_min_calls",
            u64::from(self.breaker_min_calls),
            1,
            1_000_000,
        )?;
        within(
            "resilience.breaker_probes",
            u64::from(self.breaker_probes),
            1,
            1000,
        )?;
        within(
            "resilience.breaker_close_after",
            u64::from(self.breaker_close_after),
            1,
            1000,
        )?;
        within(
            "resilience.breaker_window_ms",
            self.breaker_window_ms,
            100,
            3_600_000,
        )?;
        within(
            "resilience.breaker_cool_down_ms",
            self.breaker_cool_down_ms,
            10,
            3_600_000,
        )?;
        if !(self.breaker_failure_rate > 0.0 && self.breaker_failure_rate <= 1.0) {
            return Err(LimitsError::new(
                "resilience.breaker_failure_rate",
                "must be above 0 and at most 1",
            ));
        }
        Ok(BreakerSettings {
            window: Duration::from_millis(self.breaker_window_ms),
            min_calls: self.breaker_min_calls,
            failure_rate: self.breaker_failure_rate,
            cool_down: Duration::from_millis(self.breaker_cool_down_ms),
            probes: self.breaker_probes,
            close_after: self.breaker_close_after,
        })
    }
}
