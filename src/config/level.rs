//! One level's limits as written (`[global]`, a tier's `tenant` and `user`, a
//! model group's limits): its rates of each kind and its concurrency.

use super::money::{SpendSection, spend_rates};
use super::rates::{RateSection, rates};
use crate::domain::{LevelLimits, LimitsError};
use serde::{Deserialize, Serialize};

/// The limits of one level as written.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LevelSection {
    /// Request rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<RateSection>,
    /// Token rates (prompt + output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<RateSection>,
    /// Input (prompt) token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_tokens: Vec<RateSection>,
    /// Output token rates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_tokens: Vec<RateSection>,
    /// Spend limits, in USD.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spend: Vec<SpendSection>,
    /// Requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
}

impl LevelSection {
    /// The domain limits; `path` names the section in errors.
    pub fn to_domain(&self, path: &str) -> Result<LevelLimits, LimitsError> {
        Ok(LevelLimits {
            requests: rates(&format!("{path}.requests"), &self.requests)?,
            tokens: rates(&format!("{path}.tokens"), &self.tokens)?,
            input_tokens: rates(&format!("{path}.input_tokens"), &self.input_tokens)?,
            output_tokens: rates(&format!("{path}.output_tokens"), &self.output_tokens)?,
            spend: spend_rates(&format!("{path}.spend"), &self.spend)?,
            concurrency: self.concurrency,
        })
    }
}
