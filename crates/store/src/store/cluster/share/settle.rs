//! After the tenant's slot settled: a settlement's deltas moved in the
//! shares (an overage taken, a surplus or refund sent home), and a
//! reservation's slot freed or its lapse moved.

use super::Share;
use crate::domain::LevelPlan;
use crate::domain::budget::{Deltas, Settle, SettleReply, Settled};

/// What a settlement the tenant's slot answered with `reply` moves at the
/// global level (`None`: it applied nothing): the same deltas as one store's
/// settle, from the reservation the record held.
pub fn deltas(how: Settle, reply: &SettleReply) -> Option<Deltas> {
    let SettleReply::Applied {
        settled,
        reserved_spend,
        reserved_output,
        reserved_declared,
        ..
    } = *reply
    else {
        return None;
    };
    let cost = match (settled, how) {
        (Settled::Refunded(c), _) => c as f64,
        (Settled::Committed(amount), Settle::Commit(u)) => u.tokens as f64 - amount as f64,
        (Settled::Committed(_), Settle::Refund) => 0.0,
    };
    let declared = reserved_declared.map(|_, &n| n as f64);
    let (deltas, _) = Deltas::moving(
        how,
        cost,
        reserved_output as f64,
        reserved_spend as f64,
        &declared,
    );
    Some(deltas)
}

/// Moves the shares by a settlement's `deltas`: an overage is taken from
/// what is held, into debt if need be; a surplus or refund goes back to the
/// global key with the next sync (capped there at the limit, as on one
/// Redis), never spent here.
pub fn settle(entries: &[&LevelPlan], shares: &mut [&mut Share], deltas: Deltas, now: f64) {
    for (lp, share) in entries.iter().zip(shares.iter_mut()) {
        for b in &lp.buckets {
            let d = deltas.of(b.dimension);
            let held = share.held_mut(b, now);
            if d > 0.0 {
                held.amount -= d;
            } else if d < 0.0 {
                held.returns -= d;
            }
        }
    }
}

/// Frees the slot the reservation with lease field `lease` holds here.
/// False when this replica holds none for it (another replica leased it: a
/// message must tell that one).
pub fn release(share: &mut Share, lease: &str) -> bool {
    match share.slots.inflight.remove(lease) {
        Some(_) => {
            share.slots.free += 1.0;
            true
        }
        None => false,
    }
}

/// Moves the lapse of the slot the reservation `lease` holds here to `exp`
/// (µs; 0: released). False when this replica holds none for it.
pub fn renew(share: &mut Share, lease: &str, exp: f64) -> bool {
    if exp <= 0.0 {
        return release(share, lease);
    }
    match share.slots.inflight.get_mut(lease) {
        Some(e) => {
            *e = exp;
            true
        }
        None => false,
    }
}
