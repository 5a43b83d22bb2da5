//! The fair order of calls waiting for room at a shared level (the upstream
//! account): priority classes in order — critical, normal, batch — and,
//! within a class, weighted fair queueing among tenants over what each grant
//! takes (its tokens, or the level's dimension), first in, first out within
//! a tenant.
//!
//! The fairness is start-time fair queueing (Goyal, Vin and Cheng, 1996)
//! over one queue per tenant: only a tenant's first ticket is stamped, when
//! it comes to the front of its tenant's queue. It starts at the later of the
//! class's virtual time and the finish of its tenant's last *granted*
//! ticket, and finishes `cost / weight` later; the tenants' first tickets
//! are served by start (ties to the earlier arrival), and serving one moves
//! the virtual time to its start. So a tenant is charged for what it was
//! granted and for nothing else: a first ticket that leaves ungranted (its
//! deadline passed, its caller left) hands its start to the tenant's next,
//! however many it queued. With every tenant backlogged, a tenant of weight
//! `w` is granted `w / Σw` of what the level grants; a tenant that floods
//! only lengthens its own queue, so another tenant's next ticket is at most
//! one ticket of each other tenant behind. The account's capacity may change
//! at any time (refills, settlements): start-time fair queueing needs no
//! rate to be known.
//!
//! This is the one definition: the memory store's queue runs it, and a
//! store that keeps tickets elsewhere ports this arithmetic.
//!
//! Size: the unit tests that serve hundreds of grants with tickets running
//! out around them read the queue's internals (its tenants' clocks), so
//! they live beside it.

use crate::budget::level::FastMap;
use crate::priority::Priority;
use std::collections::{BTreeMap, BTreeSet};

/// A ticket in its queue: its class and its arrival number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    /// 0 for critical, 1 for normal, 2 for batch.
    pub class: u8,
    /// Its arrival number in the queue.
    pub seq: u64,
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

/// A first ticket's start and finish tags.
type Stamp = (f64, f64);

/// A waiting ticket.
struct Waiting<T> {
    tenant: String,
    /// `cost / weight`: how far its grant moves its tenant's finish.
    length: f64,
    waiter: T,
}

/// One tenant's queue in a class.
#[derive(Default)]
struct Flow {
    /// Its tickets' arrival numbers, first in first out.
    queued: BTreeSet<u64>,
    /// The first ticket's start and finish tags.
    stamp: Stamp,
    /// The finish of its last granted ticket.
    last_finish: f64,
}

/// The waiting calls of one shared level, in fair order, each holding a `T`
/// (what wakes its caller).
pub struct FairQueue<T> {
    tickets: FastMap<Place, Waiting<T>>,
    /// Per class and tenant: its queue.
    flows: FastMap<(u8, String), Flow>,
    /// The tenants' first tickets, by class, start and arrival.
    fronts: BTreeMap<(u8, OrderedF64, u64), Place>,
    /// Per class: its virtual time.
    virtual_time: [f64; 3],
    next_seq: u64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        FairQueue {
            tickets: FastMap::default(),
            flows: FastMap::default(),
            fronts: BTreeMap::new(),
            virtual_time: [0.0; 3],
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
    /// class for a grant of `cost` (≥ 0), holding `waiter`; its place.
    pub fn push(
        &mut self,
        priority: Priority,
        tenant: &str,
        weight: f64,
        cost: f64,
        waiter: T,
    ) -> Place {
        let place = Place {
            class: class_of(priority),
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let length = cost.max(0.0) / weight.max(f64::MIN_POSITIVE);
        let waiting = Waiting {
            tenant: tenant.to_owned(),
            length,
            waiter,
        };
        self.tickets.insert(place, waiting);
        let key = (place.class, tenant.to_owned());
        let v = self.virtual_time[usize::from(place.class)];
        let flow = self.flows.entry(key).or_insert_with(|| Flow {
            last_finish: v,
            ..Flow::default()
        });
        flow.queued.insert(place.seq);
        if flow.queued.len() == 1 {
            self.stamp_first(place.class, tenant);
        }
        place
    }

    /// The ticket first in line: its place and waiter.
    pub fn head(&self) -> Option<(&Place, &T)> {
        let place = self.fronts.values().next()?;
        Some((place, &self.tickets[place].waiter))
    }

    /// The start and finish tags of the ticket at `place`, when it is its
    /// tenant's first (only those are stamped).
    pub fn tags(&self, place: &Place) -> Option<(f64, f64)> {
        let tenant = &self.tickets.get(place)?.tenant;
        let flow = self.flows.get(&(place.class, tenant.clone()))?;
        (flow.queued.first() == Some(&place.seq)).then_some(flow.stamp)
    }

    /// The waiter of the ticket at `place`, to change it.
    pub fn waiter_mut(&mut self, place: &Place) -> Option<&mut T> {
        self.tickets.get_mut(place).map(|w| &mut w.waiter)
    }

    /// Takes the first ticket out to be granted (see [`FairQueue::serve`]).
    pub fn pop_head(&mut self) -> Option<(Place, T)> {
        let place = *self.head()?.0;
        self.serve(&place).map(|waiter| (place, waiter))
    }

    /// Takes the ticket at `place` out granted — the head when it was
    /// checked, though a newcomer with an earlier start may have joined
    /// before it since: the class's virtual time moves to its start, and its
    /// tenant's next ticket starts after its finish. Its waiter, if it was
    /// still there.
    pub fn serve(&mut self, place: &Place) -> Option<T> {
        let (waiting, stamp) = self.take(place)?;
        if let Some((start, finish)) = stamp {
            let v = &mut self.virtual_time[usize::from(place.class)];
            *v = v.max(start);
            if let Some(flow) = self.flows.get_mut(&(place.class, waiting.tenant.clone())) {
                flow.last_finish = finish;
            }
        }
        self.after_leaving(place.class, &waiting.tenant, stamp.is_some());
        Some(waiting.waiter)
    }

    /// Takes the ticket at `place` out without a grant (its deadline passed,
    /// its caller left): it costs its tenant nothing. Its waiter, if it was
    /// still there.
    pub fn withdraw(&mut self, place: &Place) -> Option<T> {
        let (waiting, stamp) = self.take(place)?;
        self.after_leaving(place.class, &waiting.tenant, stamp.is_some());
        Some(waiting.waiter)
    }

    /// Takes `place` out of the queue: the ticket, and its stamp when it was
    /// its tenant's first.
    fn take(&mut self, place: &Place) -> Option<(Waiting<T>, Option<Stamp>)> {
        let waiting = self.tickets.remove(place)?;
        let flow = self.flows.get_mut(&(place.class, waiting.tenant.clone()))?;
        let was_first = flow.queued.first() == Some(&place.seq);
        flow.queued.remove(&place.seq);
        let stamp = was_first.then_some(flow.stamp);
        if let Some((start, _)) = stamp {
            self.fronts
                .remove(&(place.class, OrderedF64(start), place.seq));
        }
        Some((waiting, stamp))
    }

    /// After a ticket of `tenant` left `class` (its first, `was_first`):
    /// stamps the tenant's next ticket, now first, or forgets a tenant with
    /// no ticket once the virtual time has caught up with its last finish
    /// (it would start there anyway). A class whose tickets all left keeps
    /// its clocks: callers whose waits ran out together and ask again are
    /// still the same backlogged tenants, each at most one grant ahead of
    /// the virtual time, so the shares hold from one busy spell to the next
    /// (the store drops an emptied line's clocks a while after its last
    /// deadline).
    fn after_leaving(&mut self, class: u8, tenant: &str, was_first: bool) {
        let key = (class, tenant.to_owned());
        let v = self.virtual_time[usize::from(class)];
        match self.flows.get(&key) {
            Some(flow) if !flow.queued.is_empty() && was_first => self.stamp_first(class, tenant),
            Some(flow) if !flow.queued.is_empty() => {}
            Some(flow) if flow.last_finish <= v => drop(self.flows.remove(&key)),
            _ => {}
        }
    }

    /// Stamps `tenant`'s first ticket in `class`: it starts at the later of
    /// the virtual time and the tenant's last finish.
    fn stamp_first(&mut self, class: u8, tenant: &str) {
        let v = self.virtual_time[usize::from(class)];
        let Some(flow) = self.flows.get_mut(&(class, tenant.to_owned())) else {
            return;
        };
        let Some(&seq) = flow.queued.first() else {
            return;
        };
        let place = Place { class, seq };
        let start = flow.last_finish.max(v);
        let finish = start + self.tickets[&place].length;
        flow.stamp = (start, finish);
        self.fronts.insert((class, OrderedF64(start), seq), place);
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
        assert_eq!(q.tags(&gone), Some((0.0, 100.0)));
        assert_eq!(q.withdraw(&gone), Some("b1"));
        assert_eq!(q.withdraw(&gone), None, "once");
        // b comes back: it starts where it would have, not after its
        // withdrawn ticket.
        let back = q.push(Priority::Normal, "b", 1.0, 100.0, "b2");
        assert_eq!(q.tags(&back), Some((0.0, 100.0)));
        assert_eq!(q.len(), 2);
        // Both served from virtual time 0, a and b are ahead of it by their
        // grants: a newcomer starts at the virtual time, b after its grant.
        while q.pop_head().is_some() {}
        assert!(q.is_empty() && q.fronts.is_empty());
        assert_eq!(q.flows.len(), 2);
        let next = q.push(Priority::Normal, "c", 1.0, 1.0, "c1");
        assert_eq!(q.tags(&next), Some((0.0, 1.0)));
        let b = q.push(Priority::Normal, "b", 1.0, 1.0, "b3");
        assert_eq!(q.tags(&b), Some((100.0, 101.0)));
    }

    #[test]
    fn tickets_that_leave_ungranted_do_not_push_their_tenant_back() {
        // Three backlogged tenants of weights 1, 1 and 2, 16 tickets each;
        // after every grant, the three oldest tickets of each tenant leave
        // without one (their deadlines passed) and their callers queue
        // again. Each tenant is charged for its grants only, so the shares
        // stay 1 : 1 : 2.
        let weights = [("a", 1.0), ("b", 1.0), ("c", 2.0)];
        let mut q = FairQueue::default();
        let mut queued: FastMap<&str, std::collections::VecDeque<Place>> = FastMap::default();
        for (t, w) in weights {
            for _ in 0..16 {
                let p = q.push(Priority::Normal, t, w, 1000.0, t);
                queued.entry(t).or_default().push_back(p);
            }
        }
        let mut granted: FastMap<&str, usize> = FastMap::default();
        for _ in 0..400 {
            let (served, tenant) = q.pop_head().unwrap();
            *granted.entry(tenant).or_insert(0) += 1;
            let mine = queued.get_mut(tenant).unwrap();
            mine.retain(|p| *p != served);
            let w = weights.iter().find(|(t, _)| *t == tenant).unwrap().1;
            mine.push_back(q.push(Priority::Normal, tenant, w, 1000.0, tenant));
            for (t, w) in weights {
                let mine = queued.get_mut(t).unwrap();
                for _ in 0..3 {
                    let old = mine.pop_front().unwrap();
                    assert!(q.withdraw(&old).is_some());
                    mine.push_back(q.push(Priority::Normal, t, w, 1000.0, t));
                }
            }
        }
        for (t, share) in [("a", 100), ("b", 100), ("c", 200)] {
            let got = granted[t] as i64;
            assert!((got - share).abs() <= 2, "{t}: {got} of 400, {granted:?}");
        }
        assert_eq!(q.len(), 48);
    }

    #[test]
    fn waits_that_run_out_together_keep_the_shares() {
        // 16 callers of each tenant; after every five grants (each granted
        // caller asking again at once) the waits of all the others run out
        // together, and each asks again as soon as its own ran out. Each
        // busy spell starts where the last left off, so the tenant of weight
        // 2 gets no head start per spell.
        let weights = [("a", 1.0), ("b", 1.0), ("c", 2.0)];
        let weight = |t: &str| weights.iter().find(|(n, _)| *n == t).unwrap().1;
        let mut q = FairQueue::default();
        let mut queued = Vec::new();
        for _ in 0..16 {
            for (t, w) in weights {
                queued.push((q.push(Priority::Normal, t, w, 1000.0, t), t));
            }
        }
        let mut granted: FastMap<&str, usize> = FastMap::default();
        for _ in 0..40 {
            for _ in 0..5 {
                let (served, tenant) = q.pop_head().unwrap();
                *granted.entry(tenant).or_insert(0) += 1;
                queued.retain(|(p, _)| *p != served);
                queued.push((
                    q.push(Priority::Normal, tenant, weight(tenant), 1000.0, tenant),
                    tenant,
                ));
            }
            for (p, t) in std::mem::take(&mut queued) {
                assert!(q.withdraw(&p).is_some());
                queued.push((q.push(Priority::Normal, t, weight(t), 1000.0, t), t));
            }
        }
        for (t, share) in [("a", 50), ("b", 50), ("c", 100)] {
            let got = granted[t] as i64;
            assert!((got - share).abs() <= 2, "{t}: {got} of 200, {granted:?}");
        }
    }
}
