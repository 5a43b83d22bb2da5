//! What the engine does when the store cannot answer: the failure policy
//! (`[resilience] policy`), read by every operation that falls back.

use serde::{Deserialize, Serialize};

/// What the service does when the store cannot answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Answer UNAVAILABLE: the gateway decides.
    FailClosed,
    /// Allow every request, flagged degraded.
    FailOpen,
    /// Decide from this replica's memory with every limit divided by the number
    /// of replicas, flagged degraded.
    #[default]
    Local,
}

impl FailurePolicy {
    /// The name as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::Local => "local",
        }
    }
}
