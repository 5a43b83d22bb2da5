//! The memory store's lines of waiting calls: [`FairQueue`] per line, with
//! what `lua/line.lua` keeps beside the queue in Redis — each ticket's
//! deadline and owner, and how long each owner counts as alive — so the two
//! answer alike (the differential test). Ticket ids are line.lua's.

use super::MemoryStore;
use crate::domain::budget::FastMap;
use crate::domain::queue::{FairQueue, Place};
use crate::domain::{Clock, Priority};
use crate::store::StoreError;
use crate::store::line::{Joined, Joining, Leave, LineStore, LineView, Standing, Ticket, owner_of};
use std::sync::{Mutex, MutexGuard};

/// How long an owner counts as alive after its last call (line.lua's ALIVE_US).
const ALIVE_US: i64 = 5_000_000;
/// How long a line's clocks outlive its latest deadline (line.lua's KEEP_US).
const KEEP_US: i64 = 1_000_000;

/// Every line, by name.
#[derive(Default)]
pub(super) struct Lines(Mutex<FastMap<String, Line>>);

/// One line: its queue, each ticket's place and deadline, its owners, and
/// its latest deadline (0: none yet).
#[derive(Default)]
struct Line {
    queue: FairQueue<String>,
    places: FastMap<String, (Place, i64)>,
    alive: FastMap<String, i64>,
    arrivals: u64,
    latest: i64,
}

impl Line {
    /// The first ticket, past the stale ones (withdrawn).
    fn first(&mut self, now: i64) -> Option<String> {
        loop {
            let (_, id) = self.queue.head()?;
            let id = id.clone();
            let (place, deadline) = self.places[&id];
            let owner_dead = self
                .alive
                .get(owner_of(&id))
                .is_some_and(|&until| until < now);
            if deadline > now && !owner_dead {
                return Some(id);
            }
            self.queue.withdraw(&place);
            self.places.remove(&id);
        }
    }

    /// Past its latest deadline by KEEP_US: what line.lua's keys expiring
    /// then drop, tickets and clocks.
    fn expired(&self, now: i64) -> bool {
        self.latest > 0 && now >= self.latest + KEEP_US
    }

    /// Nothing worth keeping: no ticket, and no clock still in use.
    fn done(&self, now: i64) -> bool {
        self.queue.is_empty() && (self.latest == 0 || self.expired(now))
    }

    fn view(&mut self, now: i64) -> LineView {
        LineView {
            first: self.first(now),
            waiting: self.queue.len(),
        }
    }
}

/// `class` as the priority whose class it is.
fn priority_of(class: u8) -> Priority {
    match class {
        0 => Priority::Critical,
        1 => Priority::Normal,
        _ => Priority::Batch,
    }
}

impl Lines {
    /// Runs `f` on `line` (made when missing) at `now`, `owner` marked alive
    /// and stale tickets dropped; lines past their keeping are forgotten
    /// first, and this one after when nothing in it is worth keeping.
    fn with<R>(&self, line: &str, owner: &str, now: i64, f: impl FnOnce(&mut Line) -> R) -> R {
        let mut lines: MutexGuard<'_, _> = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.retain(|_, l| !l.expired(now));
        let l = lines.entry(line.to_owned()).or_default();
        l.alive.insert(owner.to_owned(), now + ALIVE_US);
        l.first(now);
        let out = f(l);
        if l.done(now) {
            lines.remove(line);
        }
        out
    }
}

impl<C: Clock + Clone> LineStore for MemoryStore<C> {
    async fn join(&self, j: &Joining<'_>) -> Result<Joined, StoreError> {
        let now = self.clock.now_us();
        Ok(self.lines.with(j.line, j.owner, now, |l| {
            let waiting = l.queue.len();
            if waiting >= j.most {
                return Joined::Full { waiting };
            }
            l.arrivals += 1;
            let deadline = now + i64::try_from(j.wait_us).unwrap_or(i64::MAX / 2);
            l.latest = l.latest.max(deadline);
            let id = format!(
                "{:012}|{}|{}|{}|{}|{}",
                l.arrivals, j.owner, deadline, j.cost, j.weight, j.tenant
            );
            let place = l.queue.push(
                priority_of(j.class),
                j.tenant,
                f64::from(j.weight),
                j.cost as f64,
                id.clone(),
            );
            l.places.insert(id.clone(), (place, deadline));
            let first = l.first(now).as_deref() == Some(id.as_str());
            let ticket = Ticket {
                line: j.line.to_owned(),
                class: j.class,
                id,
            };
            Joined::Waiting { ticket, first }
        }))
    }

    async fn standing(&self, t: &Ticket, owner: &str) -> Result<Standing, StoreError> {
        let now = self.clock.now_us();
        Ok(self.lines.with(&t.line, owner, now, |l| Standing {
            first: l.first(now).as_deref() == Some(t.id.as_str()),
            waiting: l.places.contains_key(&t.id),
        }))
    }

    async fn leave(&self, t: &Ticket, owner: &str, how: Leave) -> Result<LineView, StoreError> {
        let now = self.clock.now_us();
        Ok(self.lines.with(&t.line, owner, now, |l| {
            if let Some((place, _)) = l.places.remove(&t.id) {
                match how {
                    Leave::Granted => drop(l.queue.serve(&place)),
                    Leave::Withdrawn => drop(l.queue.withdraw(&place)),
                }
            }
            l.view(now)
        }))
    }

    async fn wake(&self, line: &str, owner: &str) -> Result<LineView, StoreError> {
        let now = self.clock.now_us();
        Ok(self.lines.with(line, owner, now, |l| l.view(now)))
    }
}
