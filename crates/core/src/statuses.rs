//! Which limits' statuses a CheckAndReserve answer carries: all of them (the
//! default), the binding ones, or none. The caller chooses, so a gateway
//! that builds no headers from them pays for none.

use super::decision::{Denial, LimitState};
use super::dimension::RATE_COUNT;
use super::level::Level;

/// The statuses an answer carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Statuses {
    /// Every limit that applied.
    #[default]
    All,
    /// Per dimension the limit of the caller's own levels with the least
    /// room left (remaining ÷ limit, the innermost on a tie: the one
    /// rate-limit headers show), the global level's when it has less, and
    /// on a denial the limit that denied.
    Binding,
    /// None.
    None,
}

impl Statuses {
    /// Whether the answer carries any: with none, the limits need not be
    /// read or built at all.
    pub fn any(self) -> bool {
        self != Statuses::None
    }

    /// Of `states` (every limit that applied, outermost level first), those
    /// this choice keeps; `denial`: the call's, if denied.
    pub fn pick(self, mut states: Vec<LimitState>, denial: Option<&Denial>) -> Vec<LimitState> {
        match self {
            Statuses::All => states,
            Statuses::None => Vec::new(),
            Statuses::Binding => {
                let kept = binding(&states, denial);
                let mut i = 0;
                states.retain(|_| {
                    i += 1;
                    kept.contains(&(i - 1))
                });
                states
            }
        }
    }
}

/// Which of `states` (outermost level first) bind: per dimension, the
/// caller's own levels' limit with the least room left (the innermost on a
/// tie, as rate-limit headers choose it) and the global level's when it has
/// less; and the limit that denied.
fn binding(states: &[LimitState], denial: Option<&Denial>) -> Vec<usize> {
    // By dimension, concurrency (the last) included.
    let mut own = [None::<usize>; RATE_COUNT + 1];
    let mut global = [None::<usize>; RATE_COUNT + 1];
    for (i, s) in states.iter().enumerate() {
        let side = match s.level {
            Level::Global => &mut global,
            _ => &mut own,
        };
        let slot = &mut side[s.dimension as usize];
        if slot.is_none_or(|k| share(s) <= share(&states[k])) {
            *slot = Some(i);
        }
    }
    let mut kept: Vec<usize> = own.iter().flatten().copied().collect();
    for (g, o) in global.iter().zip(&own) {
        if let Some(g) = *g
            && o.is_none_or(|o| share(&states[g]) < share(&states[o]))
        {
            kept.push(g);
        }
    }
    if let Some(d) = denial {
        kept.extend(states.iter().position(|s| denied(d, s)));
    }
    kept
}

/// The share of a limit still free: 0 when spent (or in debt), 1 when
/// untouched; a limit of 0 counts as spent.
fn share(s: &LimitState) -> f64 {
    match s.limit {
        0 => 0.0,
        limit => s.remaining.max(0) as f64 / limit as f64,
    }
}

/// Whether `s` is the limit `d` names.
fn denied(d: &Denial, s: &LimitState) -> bool {
    d.level == Some(s.level)
        && d.dimension == Some(s.dimension)
        && d.period_secs == s.period_secs
        && d.model_group.as_deref() == s.model_group.as_ref().map(|g| g.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dimension, Reason};

    fn state(level: Level, dimension: Dimension, limit: u64, remaining: i64) -> LimitState {
        LimitState {
            level,
            model_group: None,
            dimension,
            period_secs: 60,
            window: None,
            limit,
            remaining,
            reset_after_ms: 0,
        }
    }

    fn all() -> Vec<LimitState> {
        vec![
            state(Level::Global, Dimension::Requests, 100, 90),
            state(Level::Global, Dimension::Tokens, 1000, 100),
            state(Level::Tenant, Dimension::Requests, 10, 1),
            state(Level::Tenant, Dimension::Tokens, 100, 50),
            state(Level::User, Dimension::Requests, 10, 1),
        ]
    }

    #[test]
    fn all_keeps_every_status_and_none_keeps_nothing() {
        assert_eq!(Statuses::All.pick(all(), None), all());
        assert!(Statuses::None.pick(all(), None).is_empty());
        assert!(!Statuses::None.any() && Statuses::Binding.any());
    }

    #[test]
    fn binding_keeps_the_tightest_of_each_dimension_the_inner_on_a_tie() {
        let kept = Statuses::Binding.pick(all(), None);
        let at: Vec<_> = kept.iter().map(|s| (s.level, s.dimension)).collect();
        // Requests: tenant and user both 10% left: the inner. Tokens: the
        // tenant has 50% left, and the global level, with 10%, binds tighter.
        assert_eq!(
            at,
            [
                (Level::Global, Dimension::Tokens),
                (Level::Tenant, Dimension::Tokens),
                (Level::User, Dimension::Requests),
            ]
        );
    }

    #[test]
    fn binding_keeps_the_limit_that_denied_too() {
        let denial = Denial {
            reason: Reason::RequestsExceeded,
            level: Some(Level::User),
            dimension: Some(Dimension::Requests),
            period_secs: 60,
            model_group: None,
            retry_after_ms: 10,
            detail: String::new(),
        };
        let mut states = all();
        // The tenant's requests denied, though the user has as little left.
        states[2].remaining = 0;
        states[4].remaining = 0;
        let denial = Denial {
            level: Some(Level::Tenant),
            ..denial
        };
        let kept = Statuses::Binding.pick(states, Some(&denial));
        let at: Vec<_> = kept.iter().map(|s| (s.level, s.dimension)).collect();
        assert_eq!(
            at,
            [
                (Level::Global, Dimension::Tokens),
                (Level::Tenant, Dimension::Requests),
                (Level::Tenant, Dimension::Tokens),
                (Level::User, Dimension::Requests),
            ]
        );
    }
}
