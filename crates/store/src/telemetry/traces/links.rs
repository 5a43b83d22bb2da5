//! The span of each reservation this replica made, kept for the Commit,
//! Refund or RenewLease that later names it to link to.

use super::{current_link, link, on};
use opentelemetry::trace::SpanContext;

/// Reservations' spans by reservation id, for the Commit, Refund or
/// RenewLease that later names one to link to it. Kept on the replica that
/// made the reservation (a gateway's connection usually brings the
/// settlement back to it), in two generations of at most [`LINKS_KEPT`]
/// each: a reservation's link is kept while fewer than that many were made
/// after it.
static LINKS: std::sync::Mutex<Option<Generations>> = std::sync::Mutex::new(None);
/// Links one generation holds.
const LINKS_KEPT: usize = 50_000;

#[derive(Default)]
struct Generations {
    current: std::collections::HashMap<String, SpanContext>,
    previous: std::collections::HashMap<String, SpanContext>,
}

fn links() -> std::sync::MutexGuard<'static, Option<Generations>> {
    LINKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Remembers the current operation's span as reservation `id`'s.
pub fn remember(id: &str) {
    // A span not sampled is not exported: nothing to link to.
    let Some(span) = current_link().filter(SpanContext::is_sampled) else {
        return;
    };
    let mut links = links();
    let g = links.get_or_insert_with(Generations::default);
    if g.current.len() >= LINKS_KEPT {
        g.previous = std::mem::take(&mut g.current);
    }
    g.current.insert(id.to_string(), span);
}

/// Links the current operation's span to reservation `id`'s, when this
/// replica made it; `settled`: the reservation is done with, forget it.
pub fn link_to(id: &str, settled: bool) {
    if !on() {
        return;
    }
    let span = {
        let mut links = links();
        let Some(g) = links.as_mut() else {
            return;
        };
        match settled {
            true => g.current.remove(id).or_else(|| g.previous.remove(id)),
            false => g.current.get(id).or_else(|| g.previous.get(id)).cloned(),
        }
    };
    if let Some(span) = span {
        link(span);
    }
}
