//! The fair order of calls waiting for room at a shared level (the upstream
//! account): priority classes in order — critical, normal, batch — and,
//! within a class, weighted fair queueing among tenants over what each grant
//! takes (its tokens, or the level's dimension), first in, first out within
//! a tenant.
//!
//! The fairness is start-time fair queueing (Goyal, Vin and Cheng, 1996): a
//! ticket of tenant `t` with weight `w` and cost `c` starts at the later of
//! the class's virtual time and `t`'s last finish, and finishes `c / w`
//! later; tickets are served by finish, and serving one moves the virtual
//! time to its start. With every tenant backlogged, a tenant of weight `w`
//! is granted `w / Σw` of what the level grants; a tenant that floods only
//! pushes its own finishes out, so another tenant's next ticket is at most
//! one ticket of each other tenant behind. The account's capacity may
//! change at any time (refills, settlements): start-time fair queueing needs
//! no rate to be known.
//!
//! This is the one definition: the memory store's queue runs it, and a
//! store that keeps tickets elsewhere ports this arithmetic.

use crate::budget::level::FastMap;
use crate::priority::Priority;
use std::collections::BTreeMap;

/// Where a ticket stands in its queue: its class, then its finish tag, then
/// its arrival (ties on the finish go to the earlier ticket).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Place {
    /// 0 for critical, 1 for normal, 2 for batch.
    pub class: u8,
    /// Its start tag: the virtual time it was stamped at.
    pub start: f64,
    /// Its finish tag: `start + cost / weight`.
    pub finish: f64,
    /// Its arrival number in the queue.
    pub seq: u64,
}

impl Place {
    /// The total order of the queue.
    fn key(&self) -> (u8, OrderedF64, u64) {
        (self.class, OrderedF64(self.finish), self.seq)
    }
}

/// An `f64` ordered by `total_cmp` (tags are finite and non-negative).
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrderedF64(f64);

impl Eq for OrderedF64 {}

impl PartialOrd for OrderedF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A priority class's rank: critical first.
pub fn class_of(priority: Priority) -> u8 {
    match priority {
        Priority::Critical => 0,
        Priority::Normal => 1,
        Priority::Batch => 2,
    }
}

/// The waiting calls of one shared level, in fair order, each holding a `T`
/// (what wakes its caller).
pub struct FairQueue<T> {
    tickets: BTreeMap<(u8, OrderedF64, u64), (Place, String, T)>,
    /// Per class: its virtual time.
    virtual_time: [f64; 3],
    /// Per class and tenant: the finish tag of its last ticket.
    last_finish: FastMap<(u8, String), f64>,
    next_seq: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            tickets: BTreeMap::new(),
            virtual_time: [0.0; 3],
            last_finish: FastMap::default(),
            next_seq: 0,
        }
    }
}

impl<T> FairQueue<T> {
    /// Tickets waiting.
    pub fn len(&self) -> usize {
        self.tickets.len()
    }

    /// No ticket waiting.
    pub fn is_empty(&self) -> bool {
        self.tickets.is_empty()
    }

    /// Queues a ticket of `tenant` (weight `weight` > 0) in `priority`'s
    /// class for a grant of `cost` (> 0), holding `waiter`; its place.
    pub fn push(
        &mut self,
        priority: Priority,
        tenant: &str,
        weight: f64,
        cost: f64,
        waiter: T,
    ) -> Place {
        let class = class_of(priority);
        let now = self.virtual_time[usize::from(class)];
        let key = (class, tenant.to_owned());
        let start = self.last_finish.get(&key).map_or(now, |&f| f.max(now));
        let finish = start + cost.max(0.0) / weight.max(f64::MIN_POSITIVE);
        self.last_finish.insert(key, finish);
        let place = Place {
            class,
            start,
            finish,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        self.tickets
            .insert(place.key(), (place, tenant.to_owned(), waiter));
        place
    }

    /// The ticket first in line: its place and waiter.
    pub fn head(&self) -> Option<(&Place, &T)> {
        self.tickets.values().next().map(|(p, _, w)| (p, w))
    }

    /// The waiter of the ticket at `place`, to change it.
    pub fn waiter_mut(&mut self, place: &Place) -> Option<&mut T> {
        self.tickets.get_mut(&place.key()).map(|(_, _, w)| w)
    }

    /// Takes the first ticket out to be granted: the class's virtual time
    /// moves to its start.
    pub fn pop_head(&mut self) -> Option<(Place, T)> {
        let place = *self.head()?.0;
        self.serve(&place).map(|waiter| (place, waiter))
    }

    /// Takes the ticket at `place` out granted — the head when it was
    /// checked, though a newcomer with an earlier finish may have joined
    /// before it since: the class's virtual time moves to its start. Its
    /// waiter, if it was still there.
    pub fn serve(&mut self, place: &Place) -> Option<T> {
        let (_, tenant, waiter) = self.tickets.remove(&place.key())?;
        let class = usize::from(place.class);
        self.virtual_time[class] = self.virtual_time[class].max(place.start);
        self.forget_idle(place.class, &tenant);
        Some(waiter)
    }

    /// Takes the ticket at `place` out without a grant (its deadline passed,
    /// its caller left): when it was its tenant's last, the tenant's finish
    /// goes back to its start, so a ticket that was never served costs the
    /// tenant nothing. Its waiter, if it was still there.
    pub fn withdraw(&mut self, place: &Place) -> Option<T> {
        let (_, tenant, waiter) = self.tickets.remove(&place.key())?;
        let key = (place.class, tenant);
        if self.last_finish.get(&key) == Some(&place.finish) {
            self.last_finish.insert(key.clone(), place.start);
        }
        self.forget_idle(place.class, &key.1);
        Some(waiter)
    }

    /// Forgets `tenant`'s last finish in `class` once the virtual time has
    /// caught up with it: the tenant would start at the virtual time anyway,
    /// and the map stays as small as the backlogged tenants. A class left
    /// with no ticket is idle: its virtual time moves to the last finish of
    /// any of its tenants (start-time fair queueing's idle rule), and it
    /// forgets them all.
    fn forget_idle(&mut self, class: u8, tenant: &str) {
        let v = &mut self.virtual_time[usize::from(class)];
        let first = (class, OrderedF64(f64::NEG_INFINITY), 0);
        let next = (class + 1, OrderedF64(f64::NEG_INFINITY), 0);
        if self.tickets.range(first..next).next().is_none() {
            self.last_finish.retain(|(c, _), f| {
                if *c == class {
                    *v = v.max(*f);
                }
                *c != class
            });
            return;
        }
        let key = (class, tenant.to_owned());
        if self.last_finish.get(&key).is_some_and(|&f| f <= *v) {
            self.last_finish.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants `n` heads of `q`, refilling each tenant's backlog as it is
    /// served (`cost` each); the grants per tenant.
    fn serve(
        q: &mut FairQueue<&'static str>,
        n: usize,
        weights: &[(&'static str, f64)],
        cost: f64,
    ) -> FastMap<&'static str, usize> {
        let mut granted = FastMap::default();
        for _ in 0..n {
            let (_, tenant) = q.pop_head().expect("backlogged");
            *granted.entry(tenant).or_insert(0) += 1;
            let w = weights.iter().find(|(t, _)| *t == tenant).unwrap().1;
            q.push(Priority::Normal, tenant, w, cost, tenant);
        }
        granted
    }

    #[test]
    fn backlogged_tenants_share_by_weight() {
        let weights = [("a", 1.0), ("b", 1.0), ("c", 2.0)];
        let mut q = FairQueue::default();
        for (t, w) in weights {
            for _ in 0..16 {
                q.push(Priority::Normal, t, w, 1000.0, t);
            }
        }
        let granted = serve(&mut q, 400, &weights, 1000.0);
        for (t, share) in [("a", 100), ("b", 100), ("c", 200)] {
            let got = granted[t] as i64;
            assert!((got - share).abs() <= 2, "{t}: {got} of 400, {granted:?}");
        }
    }

    #[test]
    fn a_flooding_tenant_does_not_push_back_a_newcomer() {
        let mut q = FairQueue::default();
        for _ in 0..64 {
            q.push(Priority::Normal, "flood", 1.0, 1000.0, "flood");
        }
        // Ten of the flood's are served before the small tenant arrives.
        for _ in 0..10 {
            q.pop_head();
        }
        q.push(Priority::Normal, "small", 1.0, 1000.0, "small");
        q.push(Priority::Normal, "small", 1.0, 1000.0, "small");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop_head().map(|(_, t)| t))
            .take(6)
            .collect();
        let first = order.iter().position(|t| *t == "small").unwrap();
        let second = order.iter().rposition(|t| *t == "small").unwrap();
        assert!(first <= 1 && second <= 3, "{order:?}");
    }

    #[test]
    fn classes_go_in_order_and_a_tenant_in_arrival_order() {
        let mut q = FairQueue::default();
        q.push(Priority::Batch, "a", 1.0, 1.0, "batch");
        q.push(Priority::Normal, "a", 1.0, 10.0, "normal 1");
        q.push(Priority::Normal, "a", 1.0, 1.0, "normal 2");
        q.push(Priority::Critical, "b", 1.0, 500.0, "critical");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop_head().map(|(_, t)| t)).collect();
        assert_eq!(order, ["critical", "normal 1", "normal 2", "batch"]);
    }

    #[test]
    fn a_withdrawn_ticket_costs_its_tenant_nothing() {
        let mut q = FairQueue::default();
        q.push(Priority::Normal, "a", 1.0, 100.0, "a1");
        let gone = q.push(Priority::Normal, "b", 1.0, 100.0, "b1");
        assert_eq!(q.withdraw(&gone), Some("b1"));
        assert_eq!(q.withdraw(&gone), None, "once");
        // b comes back: it starts where it would have, not after its
        // withdrawn ticket.
        let back = q.push(Priority::Normal, "b", 1.0, 100.0, "b2");
        assert_eq!((back.start, back.finish), (0.0, 100.0));
        assert_eq!(q.len(), 2);
        // Served, the tenants leave nothing behind.
        while q.pop_head().is_some() {}
        assert!(
            q.is_empty() && q.last_finish.is_empty(),
            "{:?}",
            q.last_finish
        );
        // And the next ticket starts after what was served.
        let next = q.push(Priority::Normal, "c", 1.0, 1.0, "c1");
        assert_eq!(next.start, 100.0);
    }
}
