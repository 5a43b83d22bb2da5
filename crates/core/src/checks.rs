//! Which checks of a plan denied: the mask a denied reservation carries from
//! either store (`reserve.lua` packs it) to the decision that explains it.

use crate::dimension::MAX_CHECKS;

/// Which checks of a plan denied (check i: the i-th bucket or concurrency
/// limit in plan order). Room for every check a plan can have
/// ([`MAX_CHECKS`], from the number of dimensions). A mask of one number
/// held 53 exact bits in Lua: a plan with more checks lost denials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeniedChecks([u64; WORDS]);

/// 64-bit words of a mask; the scripts send twice as many doubles of 32
/// bits (`DENIED_DOUBLES`, which build.rs writes into their prelude).
pub const WORDS: usize = MAX_CHECKS.div_ceil(64);

impl DeniedChecks {
    /// The most checks a mask holds.
    pub const MAX: usize = 64 * WORDS;

    /// Marks check `i` denied.
    pub fn insert(&mut self, i: usize) {
        debug_assert!(i < Self::MAX, "check {i} of at most {}", Self::MAX);
        if let Some(w) = self.0.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// Whether check `i` denied.
    pub fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// No check denied.
    pub fn is_empty(&self) -> bool {
        self.0 == [0; WORDS]
    }

    /// reserve.lua's mask: 2 × [`WORDS`] little-endian doubles of 32 bits
    /// each, the first holding checks 0–31. `None` when it is not one.
    pub fn from_script(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != 16 * WORDS {
            return None;
        }
        let mut out = DeniedChecks::default();
        for (k, chunk) in bytes.chunks_exact(8).enumerate() {
            let word = f64::from_le_bytes(chunk.try_into().ok()?);
            if !(0.0..=u32::MAX as f64).contains(&word) || word.fract() != 0.0 {
                return None;
            }
            out.0[k / 2] |= (word as u64) << (32 * (k % 2));
        }
        Some(out)
    }
}

/// Checks 0–63 as the bits of `mask`.
impl From<u64> for DeniedChecks {
    fn from(mask: u64) -> Self {
        let mut out = DeniedChecks::default();
        out.0[0] = mask;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::DeniedChecks;

    #[test]
    fn denied_checks_past_53_keep_every_bit_from_the_script() {
        // Checks 3, 57, 245 and 327 denied, as reserve.lua packs them.
        let mut words = [0.0f64; 2 * super::WORDS];
        words[0] = 8.0;
        words[1] = 2f64.powi(25);
        words[7] = 2f64.powi(21);
        words[10] = 2f64.powi(7);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mask = DeniedChecks::from_script(&bytes).expect("a mask");
        let denied: Vec<usize> = (0..DeniedChecks::MAX)
            .filter(|&i| mask.contains(i))
            .collect();
        assert_eq!(denied, [3, 57, 245, 327]);
        let mut built = DeniedChecks::default();
        [3, 57, 245, 327].into_iter().for_each(|i| built.insert(i));
        assert_eq!(built, mask);
        assert_eq!(DeniedChecks::from_script(&bytes[..bytes.len() - 8]), None);
    }
}
