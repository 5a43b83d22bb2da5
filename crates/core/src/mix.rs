//! What a counted prompt is made of, and the estimator sample a Commit leaves.
//!
//! A [`PromptMix`] splits the service's count of a prompt by content group
//! (Latin text, digits, symbols and code, Thai, CJK, other scripts, emoji):
//! the content-aware correction learns how many tokens each group really
//! costs the model. The reservation record keeps the mix, and a Commit turns
//! it and the upstream's count into an [`EstimatorSample`]. Both are stored as
//! bytes the Lua scripts copy without reading, so their layout lives here.

/// Content groups.
pub const GROUPS: usize = 7;

/// Group names, in order, for reports and `GetEstimator`.
pub const GROUP_NAMES: [&str; GROUPS] = [
    "latin", "digits", "symbols", "thai", "cjk", "other", "emoji",
];

/// Bytes of a stored mix: a little-endian `f32` per group.
pub use super::layout::MIX_BYTES;
const _: () = assert!(MIX_BYTES == 4 * GROUPS);

/// Bytes of a ratio-only sample (a little-endian `f64`): the layout before
/// mixes, and what a reservation without a mix still leaves.
pub const RATIO_SAMPLE_BYTES: usize = 8;

/// Bytes of a sample with a mix: the actual and the counted prompt tokens
/// (little-endian `u32`s), then the mix.
pub const MIX_SAMPLE_BYTES: usize = 8 + MIX_BYTES;

/// The service's prompt count, split by content group (in counted tokens:
/// the groups sum to the count).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PromptMix(pub [f32; GROUPS]);

impl PromptMix {
    /// The count the mix splits.
    pub fn total(&self) -> f64 {
        self.0.iter().map(|&v| f64::from(v)).sum()
    }

    /// The stored bytes.
    pub fn to_bytes(&self) -> [u8; MIX_BYTES] {
        let mut out = [0u8; MIX_BYTES];
        for (chunk, v) in out.chunks_exact_mut(4).zip(self.0) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// A mix from its stored bytes; `None` unless exactly [`MIX_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != MIX_BYTES {
            return None;
        }
        let mut mix = [0f32; GROUPS];
        for (v, chunk) in mix.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes(chunk.try_into().ok()?);
        }
        Some(PromptMix(mix))
    }
}

/// What one Commit of a prompt the service counted teaches the estimator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EstimatorSample {
    /// actual ÷ counted prompt tokens: a reservation made without a mix (the
    /// scalar correction), or a sample stored before mixes existed.
    Ratio(f64),
    /// The upstream's prompt tokens, the service's count and its mix.
    Mix {
        /// Prompt tokens the upstream counted.
        actual: u32,
        /// Prompt tokens the service counted.
        counted: u32,
        /// The service's count, by group.
        mix: PromptMix,
    },
}

impl EstimatorSample {
    /// The sample a Commit leaves: with the reservation's mix when it has one.
    pub fn of(actual: u64, estimated: f64, mix: Option<PromptMix>) -> Self {
        match mix {
            Some(mix) => EstimatorSample::Mix {
                actual: actual.min(u64::from(u32::MAX)) as u32,
                counted: estimated as u32,
                mix,
            },
            None => EstimatorSample::Ratio(actual as f64 / estimated),
        }
    }

    /// actual ÷ counted: what the scalar correction learns from.
    pub fn ratio(&self) -> f64 {
        match self {
            EstimatorSample::Ratio(r) => *r,
            EstimatorSample::Mix {
                actual, counted, ..
            } => f64::from(*actual) / f64::from(*counted),
        }
    }

    /// The stored bytes.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            EstimatorSample::Ratio(r) => r.to_le_bytes().to_vec(),
            EstimatorSample::Mix {
                actual,
                counted,
                mix,
            } => {
                let mut out = Vec::with_capacity(MIX_SAMPLE_BYTES);
                out.extend_from_slice(&actual.to_le_bytes());
                out.extend_from_slice(&counted.to_le_bytes());
                out.extend_from_slice(&mix.to_bytes());
                out
            }
        }
    }

    /// A stored sample; `None` for bytes of neither layout.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes.len() {
            RATIO_SAMPLE_BYTES => Some(EstimatorSample::Ratio(f64::from_le_bytes(
                bytes.try_into().ok()?,
            ))),
            MIX_SAMPLE_BYTES => Some(EstimatorSample::Mix {
                actual: u32::from_le_bytes(bytes[..4].try_into().ok()?),
                counted: u32::from_le_bytes(bytes[4..8].try_into().ok()?),
                mix: PromptMix::from_bytes(&bytes[8..])?,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_round_trip_through_their_bytes() {
        let mix = PromptMix([10.0, 2.5, 3.0, 40.0, 0.0, 1.0, 0.5]);
        let s = EstimatorSample::of(80, 57.0, Some(mix));
        assert!(matches!(s, EstimatorSample::Mix { counted: 57, .. }));
        assert_eq!(s.encode().len(), MIX_SAMPLE_BYTES);
        assert_eq!(EstimatorSample::decode(&s.encode()), Some(s));
        assert_eq!(s.ratio(), 80.0 / 57.0);
        let r = EstimatorSample::of(80, 64.0, None);
        assert_eq!(r, EstimatorSample::Ratio(1.25));
        assert_eq!(EstimatorSample::decode(&r.encode()), Some(r));
        assert_eq!(EstimatorSample::decode(&[0; 5]), None, "neither layout");
    }
}
