//! One reservation's record: what was reserved, who may settle it, and how it
//! ended — the struct the algorithm works on, and its bytes exactly as the Lua
//! scripts store them (the offsets of [`crate::layout`]).

use crate::layout::{
    MIX_BYTES, REC_AMOUNT, REC_COST, REC_ESTIMATED, REC_FINGERPRINT, REC_LEARNED_BYTES,
    REC_LEARNED_MASK, REC_LEARNED_OUTPUT, REC_LEARNED_SPEND, REC_LEASE_EXPIRY, REC_LEDGER_AT,
    REC_LEN, REC_LEN_LEARNED, REC_LEN_LEARNED_MIX, REC_LEN_MIX, REC_LEN_V1, REC_LEN_V2, REC_MASK,
    REC_OUTPUT, REC_OWNER, REC_SPEND, REC_STATE, STATE_COMMITTED, STATE_REFUNDED, STATE_RESERVED,
};

/// Where a reservation is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Taken, not settled yet.
    Reserved,
    /// Settled with the real usage.
    Committed,
    /// Settled with nothing used.
    Refunded,
}

/// One reservation record.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Reserved, committed or refunded.
    pub state: RecordState,
    /// Tokens reserved: prompt + granted output.
    pub cost: f64,
    /// When the lease lapses (µs).
    pub lease_expires_us: f64,
    /// Bit per level holding a lease ([`crate::Level::bit`]).
    pub mask: u8,
    /// Who may settle it ([`crate::ReservationId::owner_tag`]).
    pub owner: u64,
    /// The request's fingerprint: an idempotent retry must match it.
    pub fingerprint: u64,
    /// Committed: actual − reserved; refunded: the tokens returned; 0 before.
    pub amount: f64,
    /// The service's prompt count (0: the caller counted).
    pub estimated: f64,
    /// Output tokens granted; the rest of `cost` is prompt.
    pub output: f64,
    /// Spend reserved, µ$.
    pub spend: f64,
    /// When the reservation entered the usage ledger (µs; 0: it did not).
    pub ledger_at: f64,
    /// The counted prompt's mix, when the content-aware correction made it:
    /// the Commit's estimator sample carries it.
    pub mix: Option<PromptMix>,
    /// The learned output some levels hold instead of `output`.
    pub learned: Option<LearnedOutput>,
    /// What the call declared in each dimension the caller counts
    /// ([`crate::Dimension::is_declared`]): what settling gives back
    /// or takes the difference from.
    pub declared: DimMap<f64>,
}

/// Bytes of a record's declared part: a double per declared dimension,
/// after the learned output (if any) and before the mix (if any); stored
/// only when one is not 0.
pub const DECLARED_BYTES: usize = 8 * DECLARED_COUNT;

// Which optional parts a record has follows from its length alone: each
// part is shorter than the sum of those before it in this list — mix,
// learned, declared — so no two sets of parts have one length.
const _: () = assert!(DECLARED_BYTES < REC_LEARNED_BYTES);
const _: () = assert!(REC_LEARNED_BYTES + DECLARED_BYTES < MIX_BYTES);

/// The optional parts of a record of `len` bytes: its learned output, its
/// declared part, its mix; `None` when no record has that length. Lua: the
/// same arithmetic in settle.lua.
pub fn parts(len: usize) -> Option<(bool, bool, bool)> {
    if len == REC_LEN_V1 || len == REC_LEN_V2 {
        return Some((false, false, false));
    }
    let mut rest = len.checked_sub(REC_LEN)?;
    let mix = rest >= MIX_BYTES;
    if mix {
        rest -= MIX_BYTES;
    }
    let learned = rest >= REC_LEARNED_BYTES;
    if learned {
        rest -= REC_LEARNED_BYTES;
    }
    let declared = rest != 0 && rest == DECLARED_BYTES;
    if declared {
        rest = 0;
    }
    (rest == 0).then_some((learned, declared, mix))
}

/// The learned output held at some levels of a reservation (the others hold
/// the granted output).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearnedOutput {
    /// The bits of the levels holding it ([`crate::LevelPlan::bit`]).
    pub mask: u8,
    /// The output tokens they hold (less than the granted output).
    pub output: f64,
    /// The spend they hold, µ$.
    pub spend: f64,
}

impl Record {
    /// The output tokens and spend the level of `bit` holds.
    pub fn held_at(&self, bit: u8) -> (f64, f64) {
        match self.learned {
            Some(l) if l.mask & bit != 0 => (l.output, l.spend),
            _ => (self.output, self.spend),
        }
    }
}

use crate::DimMap;
use crate::dimension::{DECLARED_COUNT, DECLARED_FIRST, Dimension};
use crate::mix::PromptMix;

/// A stored record that is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "a reservation record of {len} bytes starting {state:?} is not {REC_LEN} (or {REC_LEN_MIX}, {REC_LEN_LEARNED}, {REC_LEN_LEARNED_MIX}, {REC_LEN_V2} or {REC_LEN_V1}) bytes of a known state"
)]
pub struct BadRecord {
    /// Its length.
    pub len: usize,
    /// Its first byte, if any.
    pub state: Option<u8>,
}

impl Record {
    /// The record's bytes as the scripts store them.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(REC_LEN_LEARNED_MIX);
        out.push(match self.state {
            RecordState::Reserved => STATE_RESERVED,
            RecordState::Committed => STATE_COMMITTED,
            RecordState::Refunded => STATE_REFUNDED,
        });
        out.extend_from_slice(&self.cost.to_le_bytes());
        out.extend_from_slice(&self.lease_expires_us.to_le_bytes());
        out.push(self.mask);
        out.extend_from_slice(&self.owner.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.to_le_bytes());
        out.extend_from_slice(&self.amount.to_le_bytes());
        out.extend_from_slice(&self.estimated.to_le_bytes());
        out.extend_from_slice(&self.output.to_le_bytes());
        out.extend_from_slice(&self.spend.to_le_bytes());
        out.extend_from_slice(&self.ledger_at.to_le_bytes());
        debug_assert_eq!(out.len(), REC_LEN);
        if let Some(l) = &self.learned {
            out.push(l.mask);
            out.extend_from_slice(&l.output.to_le_bytes());
            out.extend_from_slice(&l.spend.to_le_bytes());
        }
        write_declared(&mut out, &self.declared);
        if let Some(mix) = &self.mix {
            out.extend_from_slice(&mix.to_bytes());
        }
        out
    }

    /// A stored record back to the struct; a record of an earlier layout
    /// reads as not in the ledger ([`REC_LEN_V2`] bytes) and, before that,
    /// as granted output 0 and no spend ([`REC_LEN_V1`] bytes).
    pub fn decode(bytes: &[u8]) -> Result<Self, BadRecord> {
        let bad = || BadRecord {
            len: bytes.len(),
            state: bytes.first().copied(),
        };
        let Some((learned, declared, mix)) = parts(bytes.len()) else {
            return Err(bad());
        };
        let state = match bytes[REC_STATE - 1] {
            STATE_RESERVED => RecordState::Reserved,
            STATE_COMMITTED => RecordState::Committed,
            STATE_REFUNDED => RecordState::Refunded,
            _ => return Err(bad()),
        };
        let word = |at: usize| -> [u8; 8] { bytes[at - 1..at + 7].try_into().expect("8 bytes") };
        // A field the layout has, or 0 in an earlier layout.
        let since = |at: usize| match bytes.len() >= at + 7 {
            true => f64::from_le_bytes(word(at)),
            false => 0.0,
        };
        Ok(Record {
            state,
            cost: f64::from_le_bytes(word(REC_COST)),
            lease_expires_us: f64::from_le_bytes(word(REC_LEASE_EXPIRY)),
            mask: bytes[REC_MASK - 1],
            owner: u64::from_le_bytes(word(REC_OWNER)),
            fingerprint: u64::from_le_bytes(word(REC_FINGERPRINT)),
            amount: f64::from_le_bytes(word(REC_AMOUNT)),
            estimated: f64::from_le_bytes(word(REC_ESTIMATED)),
            output: since(REC_OUTPUT),
            spend: since(REC_SPEND),
            ledger_at: since(REC_LEDGER_AT),
            mix: match mix {
                true => PromptMix::from_bytes(&bytes[bytes.len() - MIX_BYTES..]),
                false => None,
            },
            declared: match declared {
                true => {
                    let at = REC_LEN + if learned { REC_LEARNED_BYTES } else { 0 };
                    let mut values = DimMap::default();
                    for (i, d) in Dimension::RATES[DECLARED_FIRST - 1..].iter().enumerate() {
                        values[*d] = f64::from_le_bytes(word(at + 1 + 8 * i));
                    }
                    values
                }
                false => DimMap::default(),
            },
            learned: learned.then(|| LearnedOutput {
                mask: bytes[REC_LEARNED_MASK - 1],
                output: f64::from_le_bytes(word(REC_LEARNED_OUTPUT)),
                spend: f64::from_le_bytes(word(REC_LEARNED_SPEND)),
            }),
        })
    }

    /// The tail a reserve call sends the script: the bytes from
    /// [`REC_MASK`] to [`REC_ESTIMATED`] (mask, owner, fingerprint and a
    /// zero amount), then the declared part (if any is not 0), which the
    /// script puts after a learned output.
    pub fn tail(mask: u8, owner: u64, fingerprint: u64, declared: &DimMap<f64>) -> Vec<u8> {
        let mut tail = Vec::with_capacity(REC_ESTIMATED - REC_MASK + DECLARED_BYTES + MIX_BYTES);
        tail.push(mask);
        tail.extend_from_slice(&owner.to_le_bytes());
        tail.extend_from_slice(&fingerprint.to_le_bytes());
        tail.extend_from_slice(&0f64.to_le_bytes());
        debug_assert_eq!(tail.len(), REC_ESTIMATED - REC_MASK);
        write_declared(&mut tail, declared);
        tail
    }
}

/// Appends the declared part of `declared` to `out`, when one is not 0.
fn write_declared(out: &mut Vec<u8>, declared: &DimMap<f64>) {
    if declared.declared().iter().any(|v| *v != 0.0) {
        for v in declared.declared() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_its_tail_sits_where_the_scripts_read_it() {
        let rec = Record {
            state: RecordState::Committed,
            cost: 1234.0,
            lease_expires_us: 1.8e15,
            mask: 5,
            owner: 0x0102_0304_0506_0708,
            fingerprint: u64::MAX - 7,
            amount: -17.0,
            estimated: 99.0,
            output: 200.0,
            spend: 75_000.0,
            ledger_at: 1.7e15,
            mix: Some(PromptMix([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.5])),
            learned: None,
            declared: DimMap::default(),
        };
        let learned = Record {
            learned: Some(LearnedOutput {
                mask: 6,
                output: 40.0,
                spend: 15_000.0,
            }),
            ..rec.clone()
        };
        let both = learned.encode();
        assert_eq!(both.len(), REC_LEN_LEARNED_MIX);
        assert_eq!(Record::decode(&both), Ok(learned.clone()));
        assert_eq!(
            both[REC_LEN_LEARNED..],
            rec.encode()[REC_LEN..],
            "the mix is last"
        );
        let no_mix = Record {
            mix: None,
            ..learned.clone()
        };
        assert_eq!(Record::decode(&no_mix.encode()), Ok(no_mix.clone()));
        assert_eq!(learned.held_at(2), (40.0, 15_000.0));
        assert_eq!(learned.held_at(1), (200.0, 75_000.0));
        let bytes = rec.encode();
        assert_eq!(bytes.len(), REC_LEN_MIX);
        let no_mix = Record::decode(&bytes[..REC_LEN]).expect("a record without a mix reads");
        assert_eq!(no_mix.mix, None);
        assert_eq!(Record::decode(&bytes), Ok(rec.clone()));
        assert_eq!(bytes[0], b'C');
        let tail = Record::tail(rec.mask, rec.owner, rec.fingerprint, &DimMap::default());
        assert_eq!(tail[..17], bytes[REC_MASK - 1..REC_AMOUNT - 1]);
        assert!(Record::decode(&bytes[..49]).is_err());
        let old = Record::decode(&bytes[..REC_LEN_V1]).expect("the previous layout reads");
        assert_eq!(old.output, 0.0);
        let v2 = Record::decode(&bytes[..REC_LEN_V2]).expect("the layout before the ledger reads");
        assert_eq!((v2.spend, v2.ledger_at), (75_000.0, 0.0));
        let mut wrong = bytes;
        wrong[0] = b'X';
        assert!(Record::decode(&wrong).is_err());
    }
}
