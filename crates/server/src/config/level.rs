//! One level's limits as written (`[global]`, a tier's `tenant`, `user` and
//! `session`, a model group's limits): its rates of each kind and its
//! concurrency.

use super::dims::{ByDimension, WithDimensions, read_section};
use super::rates::{RateSection, rates};
use crate::domain::output::OutputReservation;
use crate::domain::{DimMap, LevelLimits, LimitsError};
use serde::de::MapAccess;
use serde::{Deserialize, Deserializer, Serialize};

/// The limits of one level as written: a key per dimension
/// ([`super::dims`]) and these; any other key is refused.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LevelSection {
    /// The rates of each dimension, by its name (`tokens = [...]`; spend
    /// limits in USD, `limit_usd`).
    #[serde(flatten)]
    pub rates: ByDimension<Vec<RateSection>>,
    /// Requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u64>,
    /// `"max"` (default) or `"learned"`: how much output a reservation holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_reservation: Option<String>,
    /// With `"learned"`: the overrun credit, a share of the level's token
    /// limit (default 0.5, at most 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_overrun: Option<f64>,
}

impl<'de> Deserialize<'de> for LevelSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        read_section(d)
    }
}

impl<'de> WithDimensions<'de> for LevelSection {
    type Rates = Vec<RateSection>;
    const KEYS: &'static [&'static str] = &["concurrency", "output_reservation", "output_overrun"];

    fn rates(&mut self) -> &mut ByDimension<Vec<RateSection>> {
        &mut self.rates
    }

    fn read_own<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "concurrency" => self.concurrency = map.next_value()?,
            "output_reservation" => self.output_reservation = map.next_value()?,
            "output_overrun" => self.output_overrun = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl LevelSection {
    /// True when the section sets nothing.
    pub fn is_empty(&self) -> bool {
        self.rates.is_unset()
            && self.concurrency.is_none()
            && self.output_reservation.is_none()
            && self.output_overrun.is_none()
    }

    /// The domain limits; `path` names the section in errors.
    pub fn to_domain(&self, path: &str) -> Result<LevelLimits, LimitsError> {
        let mut limits = DimMap::default();
        for (dimension, written) in self.rates.0.iter() {
            limits[dimension] = rates(
                &format!("{path}.{}", dimension.as_str()),
                dimension,
                written,
            )?;
        }
        Ok(LevelLimits {
            rates: limits,
            concurrency: self.concurrency,
            output: self.output(path)?,
        })
    }

    /// The section of `limits`, as it would be written.
    pub fn of(limits: &LevelLimits) -> Self {
        LevelSection {
            rates: ByDimension(
                limits
                    .rates
                    .map(|d, rates| rates.iter().map(|r| RateSection::of(r, d)).collect()),
            ),
            concurrency: limits.concurrency,
            output_reservation: limits
                .output
                .is_learned()
                .then(|| limits.output.as_str().to_owned()),
            output_overrun: match limits.output {
                OutputReservation::Learned { overrun_permille } => {
                    Some(f64::from(overrun_permille) / 1000.0)
                }
                OutputReservation::Max => None,
            },
        }
    }

    /// The output reservation as written: `output_reservation` and
    /// `output_overrun`, checked.
    fn output(&self, path: &str) -> Result<OutputReservation, LimitsError> {
        let learned = match self.output_reservation.as_deref() {
            None | Some("max") => false,
            Some("learned") => true,
            Some(other) => {
                return Err(LimitsError::new(
                    format!("{path}.output_reservation"),
                    format!("{other:?} is not an output reservation; use \"max\" or \"learned\""),
                ));
            }
        };
        let max = f64::from(OutputReservation::MAX_OVERRUN_PERMILLE) / 1000.0;
        let overrun = match self.output_overrun {
            None => OutputReservation::DEFAULT_OVERRUN_PERMILLE,
            Some(_) if !learned => {
                return Err(LimitsError::new(
                    format!("{path}.output_overrun"),
                    "goes with output_reservation = \"learned\"",
                ));
            }
            Some(o) if (0.0..=max).contains(&o) => (o * 1000.0).round() as u32,
            Some(o) => {
                return Err(LimitsError::new(
                    format!("{path}.output_overrun"),
                    format!(
                        "must be between 0 and {max} (a share of the level's token limit), got {o}"
                    ),
                ));
            }
        };
        Ok(match learned {
            true => OutputReservation::Learned {
                overrun_permille: overrun,
            },
            false => OutputReservation::Max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(toml: &str) -> Result<LevelLimits, String> {
        let section: LevelSection = toml::from_str(toml).map_err(|e| e.to_string())?;
        let limits = section
            .to_domain("tiers.t.tenant")
            .map_err(|e| e.to_string())?;
        limits
            .validate("tiers.t.tenant")
            .map_err(|e| e.to_string())?;
        Ok(limits)
    }

    #[test]
    fn a_learned_output_needs_a_rolling_token_rate_and_an_overrun_in_range() {
        let tpm = r#"tokens = [{ limit = 1000, period = "1m" }]"#;
        let ok = level(&format!("{tpm}\noutput_reservation = \"learned\"")).unwrap();
        assert_eq!(
            ok.output,
            OutputReservation::Learned {
                overrun_permille: 500
            }
        );
        let err = level("output_reservation = \"learned\"").unwrap_err();
        assert!(
            err.contains("tiers.t.tenant.output_reservation") && err.contains("rolling"),
            "{err}"
        );
        let err = level(&format!("{tpm}\noutput_reservation = \"some\"")).unwrap_err();
        assert!(err.contains("\"max\" or \"learned\""), "{err}");
        let err = level(&format!(
            "{tpm}\noutput_reservation = \"learned\"\noutput_overrun = 11"
        ))
        .unwrap_err();
        assert!(
            err.contains("output_overrun") && err.contains("between 0 and 10"),
            "{err}"
        );
        let err = level(&format!("{tpm}\noutput_overrun = 1")).unwrap_err();
        assert!(err.contains("goes with output_reservation"), "{err}");
        assert_eq!(level(tpm).unwrap().output, OutputReservation::Max);
    }
}
