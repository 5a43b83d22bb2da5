//! How much output a level holds for a reservation: the caller's whole
//! `max_output_tokens`, or what completions under the same estimator key and
//! tier have recently used (the learned output), bounded by the level's
//! overrun credit.
//!
//! A learned reservation can be overrun by every call in flight at once. The
//! overrun credit caps that: a level may hold less than the grant only while
//! its credit covers the difference (`grant − learned`); the reservation takes
//! that much from the credit and its settle gives it back; a reservation
//! never settled gives it back by refill. So what calls in flight can take
//! beyond what the level holds is at most the credit's capacity, plus its
//! refill over the time they stay in flight.

/// A level's output reservation (`output_reservation` in a level's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputReservation {
    /// Hold the whole grant (the caller's `max_output_tokens`, or what fits).
    #[default]
    Max,
    /// Hold the learned output while the overrun credit covers the rest.
    Learned {
        /// The credit's capacity in thousandths of the level's token limit
        /// (`output_overrun` × 1000).
        overrun_permille: u32,
    },
}

impl OutputReservation {
    /// The default `output_overrun`: half the level's token limit.
    pub const DEFAULT_OVERRUN_PERMILLE: u32 = 500;
    /// The largest `output_overrun`: ten times the token limit.
    pub const MAX_OVERRUN_PERMILLE: u32 = 10_000;

    /// Its name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputReservation::Max => "max",
            OutputReservation::Learned { .. } => "learned",
        }
    }

    /// True for `"learned"`.
    pub fn is_learned(self) -> bool {
        matches!(self, OutputReservation::Learned { .. })
    }
}

/// A learned level's overrun credit: what its reservations in flight may
/// still use beyond what it holds for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverrunCredit {
    /// Tokens the credit holds when full.
    pub capacity: u64,
    /// How long an empty credit takes to fill (s): its token limit's period.
    pub period_secs: u64,
}

impl OverrunCredit {
    /// The credit at `now` (µs), from `stored` (credit, time written; `None`:
    /// never written, full): it refills at capacity per period, never above.
    pub fn now(&self, stored: Option<(f64, f64)>, now: f64) -> f64 {
        let capacity = self.capacity as f64;
        match stored {
            None => capacity,
            Some((credit, t)) => {
                let refill = (now - t).max(0.0) * capacity / self.refill_us();
                (credit + refill).min(capacity)
            }
        }
    }

    /// The period over which an empty credit fills, µs.
    pub fn refill_us(&self) -> f64 {
        self.period_secs as f64 * 1e6
    }
}

/// What a reservation holds at one level: `grant` output tokens, or the
/// `learned` output where the level holds it (`learned < grant`).
pub fn held(grant: f64, learned: Option<f64>) -> f64 {
    match learned {
        Some(l) if l < grant => l,
        _ => grant,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credit_refills_over_its_period_and_never_above_its_capacity() {
        let c = OverrunCredit {
            capacity: 1000,
            period_secs: 60,
        };
        assert_eq!(c.now(None, 5.0), 1000.0);
        assert_eq!(c.now(Some((100.0, 0.0)), 30e6), 600.0);
        assert_eq!(c.now(Some((100.0, 0.0)), 600e6), 1000.0);
        assert_eq!(
            c.now(Some((100.0, 10.0)), 5.0),
            100.0,
            "time never runs back"
        );
        assert_eq!(held(500.0, Some(80.0)), 80.0);
        assert_eq!(held(50.0, Some(80.0)), 50.0);
        assert_eq!(held(50.0, None), 50.0);
    }
}
