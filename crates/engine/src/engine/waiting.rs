//! Waiting in line for a shared level: a CheckAndReserve with `max_wait`
//! that only the global level (the upstream account, or a model group's
//! limits there) denies joins that level's queue, in the fair order of
//! [`FairQueue`], and is retried when it is first in line and room may have
//! come — at the refill time its last denial computed, or when a Commit or
//! Refund of this replica returns tokens. It is granted by the same atomic
//! reserve as any call, so nothing goes over a limit; it gets its last
//! denial when its time runs out. A caller that goes away drops its wait,
//! and its ticket leaves the queue.
//!
//! The queue is this replica's: exact for the memory store (which is the
//! replica's own), in this replica's order for a shared Redis.

use super::{Engine, EngineError, ReserveOutcome};
use crate::domain::budget::level::FastMap;
use crate::domain::plan::ReserveRequest;
use crate::domain::queue::{FairQueue, Place};
use crate::store::Store;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The queues of this replica's shared levels, by model group ("" for the
/// global level's own limits).
#[derive(Default)]
pub(super) struct Queues {
    lines: Mutex<FastMap<String, FairQueue<Arc<Notify>>>>,
    /// Calls waiting over every line, kept beside them so that a Commit or
    /// Refund with nobody waiting takes no lock.
    waiting: AtomicUsize,
}

impl Queues {
    /// Wakes the first in every line: room may have come back (a Commit or
    /// Refund).
    pub(super) fn room(&self) {
        if self.waiting() == 0 {
            return;
        }
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        for line in lines.values() {
            if let Some((_, notify)) = line.head() {
                notify.notify_one();
            }
        }
    }

    /// Calls waiting, over every line.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    fn with<R>(&self, line: &str, f: impl FnOnce(&mut FairQueue<Arc<Notify>>) -> R) -> R {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if !lines.contains_key(line) {
            lines.insert(line.to_owned(), FairQueue::default());
        }
        let queue = lines.get_mut(line).expect("inserted above");
        let out = f(queue);
        if queue.is_empty() {
            lines.remove(line);
        }
        let total = lines.values().map(FairQueue::len).sum();
        self.waiting.store(total, Ordering::Relaxed);
        out
    }
}

/// A ticket in a line; dropped, it leaves the line and wakes the next.
struct Ticket<'a> {
    queues: &'a Queues,
    line: String,
    place: Option<Place>,
    notify: Arc<Notify>,
}

impl Ticket<'_> {
    /// Whether it is first in its line.
    fn is_head(&self) -> bool {
        let Some(place) = self.place else {
            return false;
        };
        self.queues.with(&self.line, |q| {
            q.head().is_some_and(|(p, _)| p.seq == place.seq)
        })
    }

    /// Leaves the line granted: the line's fair clock moves past it, and the
    /// next in line is woken to try.
    fn granted(mut self) {
        if self.place.take().is_some() {
            self.queues.with(&self.line, |q| {
                q.pop_head();
                if let Some((_, next)) = q.head() {
                    next.notify_one();
                }
            });
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(place) = self.place.take() {
            self.queues.with(&self.line, |q| {
                q.withdraw(&place);
                if let Some((_, next)) = q.head() {
                    next.notify_one();
                }
            });
        }
    }
}

/// `out`, the denial of a call that found its line full: answered at once,
/// saying so.
fn full(mut out: ReserveOutcome, max: usize) -> ReserveOutcome {
    if let Some(d) = &mut out.denial {
        d.detail.push_str(&format!(
            "; the line for the shared account is full ({max} calls waiting, [queue] \
             max_queued): retry after retry_after_ms"
        ));
    }
    out
}

/// Counts a wait whose caller went away (its future dropped) as cancelled.
struct Gone<'a> {
    started: Instant,
    queues: &'a Queues,
    armed: bool,
}

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        if self.armed {
            crate::telemetry::queue_wait("cancelled", self.started.elapsed().as_secs_f64());
            crate::telemetry::queue_waiting(self.queues.waiting());
        }
    }
}

impl<S: Store> Engine<S> {
    /// [`Engine::reserve`], waiting in line up to `max_wait` when only a
    /// shared level denies the call (module docs); `waiting` runs when it
    /// joins the line (its caller gives back what it holds while it works).
    /// `max_wait` zero, a call with fallback models or a denial elsewhere:
    /// answered at once.
    pub async fn reserve_within(
        &self,
        req: ReserveRequest,
        max_wait: Duration,
        waiting: impl FnOnce(),
    ) -> Result<ReserveOutcome, EngineError> {
        if max_wait.is_zero() || !req.fallbacks.is_empty() {
            // Not boxed again: the caller boxes this whole future.
            return self.reserve(req).await;
        }
        let started = Instant::now();
        let deadline = started + max_wait;
        let first = Box::pin(self.reserve(req.clone())).await?;
        let Some(denial) = first.denial.as_ref().filter(|_| first.waitable) else {
            return Ok(first);
        };
        let line = denial.model_group.clone().unwrap_or_default();
        let notify = Arc::new(Notify::new());
        // The tenant's weight: its tier's, or its override's.
        let tier = self.resolve_tier(&self.limits(), &req.tier, req.tenant.as_str());
        let weight = f64::from(tier.map_or(1, |t| t.weight));
        let cost = first.reserved_tokens.max(1) as f64;
        let max = self.settings.max_queued;
        let place = self.queues.with(&line, |q| {
            (q.len() < max).then(|| {
                q.push(
                    req.priority,
                    req.tenant.as_str(),
                    weight,
                    cost,
                    notify.clone(),
                )
            })
        });
        let Some(place) = place else {
            crate::telemetry::queue_wait("full", 0.0);
            return Ok(full(first, max));
        };
        let ticket = Ticket {
            queues: &self.queues,
            line,
            place: Some(place),
            notify,
        };
        crate::telemetry::queue_waiting(self.queues.waiting());
        waiting();
        let mut gone = Gone {
            started,
            queues: &self.queues,
            armed: true,
        };
        let out = self.wait_in_line(req, first, ticket, deadline).await;
        gone.armed = false;
        crate::telemetry::queue_waiting(self.queues.waiting());
        let waited = started.elapsed();
        let outcome = match &out {
            Ok(o) if o.denial.is_none() => "granted",
            Ok(o) if o.waitable => "expired",
            Ok(_) => "denied",
            Err(_) => "failed",
        };
        crate::telemetry::queue_wait(outcome, waited.as_secs_f64());
        out.map(|mut o| {
            o.waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            o
        })
    }

    /// Waits with `ticket` until the call is granted, denied elsewhere, or
    /// `deadline` passes (its last denial, `last`, then answers).
    async fn wait_in_line(
        &self,
        req: ReserveRequest,
        mut last: ReserveOutcome,
        ticket: Ticket<'_>,
        deadline: Instant,
    ) -> Result<ReserveOutcome, EngineError> {
        loop {
            let retry_ms = last.denial.as_ref().map_or(0, |d| d.retry_after_ms);
            let retry_in = Duration::from_millis(retry_ms.max(1));
            let wake = match ticket.is_head() {
                true => (Instant::now() + retry_in).min(deadline),
                false => deadline,
            };
            let _ = tokio::time::timeout_at(wake.into(), ticket.notify.notified()).await;
            if Instant::now() >= deadline {
                return Ok(last);
            }
            if !ticket.is_head() {
                continue;
            }
            let out = Box::pin(self.reserve(req.clone())).await?;
            match (&out.denial, out.waitable) {
                (None, _) => {
                    ticket.granted();
                    return Ok(out);
                }
                (Some(_), true) => last = out,
                (Some(_), false) => return Ok(out),
            }
        }
    }
}
