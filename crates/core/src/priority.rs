//! Priority classes and their headroom: the share of every limit a class may
//! not take, kept for the classes above it. With headroom `h`, a request is
//! allowed only if each bucket keeps at least `h × limit` after taking its
//! cost, and each concurrency limit at least `h × limit` free slots.

use super::tier::LimitsError;

/// How much a request matters when budgets run short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Priority {
    /// Interactive traffic that must get through: may take the last of a limit
    /// (with the default headroom of 0).
    Critical,
    /// Ordinary traffic (the default).
    #[default]
    Normal,
    /// Background and bulk work: the first to be refused.
    Batch,
}

impl Priority {
    /// Lower-case name for messages and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Normal => "normal",
            Priority::Batch => "batch",
        }
    }
}

/// `[priorities]`: each class's headroom, a share in [0, 1).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Priorities {
    /// Headroom of critical requests.
    pub critical: f64,
    /// Headroom of normal requests.
    pub normal: f64,
    /// Headroom of batch requests.
    pub batch: f64,
}

impl Priorities {
    /// The share of every limit a request of `priority` must leave.
    pub fn headroom(&self, priority: Priority) -> f64 {
        match priority {
            Priority::Critical => self.critical,
            Priority::Normal => self.normal,
            Priority::Batch => self.batch,
        }
    }

    /// Every share must be at least 0 and below 1.
    pub fn validate(&self) -> Result<(), LimitsError> {
        for (name, h) in [
            ("critical", self.critical),
            ("normal", self.normal),
            ("batch", self.batch),
        ] {
            if !(0.0..1.0).contains(&h) {
                return Err(LimitsError::new(
                    format!("priorities.{name}"),
                    format!("a share of every limit, at least 0 and below 1 (0.1 = 10%), got {h}"),
                ));
            }
        }
        Ok(())
    }
}
