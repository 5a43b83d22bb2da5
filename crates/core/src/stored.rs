//! What the core does with bytes it did not write itself, as one function:
//! the stored forms it decodes (a level's state, a reservation record, a
//! ledger row, an alert record, an estimator sample, a prompt mix) and the
//! ids and words it parses. Redis may hold foreign or damaged data under the
//! key prefix, and ids come from callers: whatever the bytes, each decoder
//! answers (a value or its refusal) and never panics. The core-only fuzz
//! target (`fuzz/fuzz_targets/stored_bytes.rs`) drives it; compiled only
//! under `cargo fuzz` (`--cfg fuzzing`) and for the unit tests.

use crate::alert::AlertRecord;
use crate::budget::record::Record;
use crate::budget::state::LevelState;
use crate::ids::ReservationId;
use crate::ledger::Row;
use crate::mix::{EstimatorSample, PromptMix};
use crate::window::{WindowKind, parse_zone};

/// Decodes or parses `data` as the form its first byte picks; `true` when
/// the form took it.
pub fn decode_any(data: &[u8]) -> bool {
    let Some((&selector, body)) = data.split_first() else {
        return false;
    };
    let text = String::from_utf8_lossy(body);
    match selector % 9 {
        0 => LevelState::decode(body).is_ok_and(|s| s.is_some()),
        1 => Record::decode(body).is_ok(),
        2 => Row::decode(body).is_some(),
        3 => AlertRecord::decode(body).is_some(),
        4 => EstimatorSample::decode(body).is_some(),
        5 => PromptMix::from_bytes(body).is_some(),
        6 => ReservationId::parse(&text).is_ok(),
        7 => WindowKind::parse(&text).is_some(),
        _ => parse_zone(&text).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Random bytes of every length up to a long record's, and each form's
    /// exact lengths with random contents: no decoder panics.
    #[test]
    fn no_bytes_make_a_decoder_panic() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(44);
        for _ in 0..20_000 {
            let len = rng.random_range(0..600);
            let mut data = vec![0u8; len];
            rng.fill(&mut data[..]);
            decode_any(&data);
        }
        for selector in 0u8..9 {
            for len in [0usize, 7, 8, 16, 48, 64, 96, 128, 256] {
                for fill in [0u8, 0xff, 0x7f] {
                    let mut data = vec![fill; len + 1];
                    data[0] = selector;
                    decode_any(&data);
                }
            }
        }
    }

    #[test]
    fn each_form_takes_what_the_core_writes() {
        let tenant = crate::ids::TenantId::parse("acme").unwrap();
        let user = crate::ids::UserId::parse("u").ok();
        let id = ReservationId::generate(tenant, user, "free".into(), "gpt-4o".into());
        let mut data = vec![6u8];
        data.extend_from_slice(id.to_string().as_bytes());
        assert!(decode_any(&data), "{id}");
        assert!(decode_any(b"\x07month"));
        assert!(decode_any(b"\x08Europe/Paris"));
        assert!(!decode_any(b"\x07fortnight"));
    }
}
