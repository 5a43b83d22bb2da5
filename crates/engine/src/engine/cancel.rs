//! Cancelling reservations the caller never received.
//!
//! A CheckAndReserve whose store call failed (its deadline passed, the
//! connection dropped) was answered without the reservation — degraded,
//! UNAVAILABLE or an error — yet its script may still run: a frozen Redis runs
//! every queued call once it wakes. Such a reservation would hold its
//! concurrency slots, request and tokens until its lease lapsed, and nobody can
//! settle it, since nobody has its id. So every such reservation is queued
//! here and refunded by id as soon as the store answers again, retried with
//! backoff:
//!
//! - Applied, or already settled (nobody else has the id, so an earlier
//!   attempt that timed out here applied): done, its budget is back.
//! - Not found: the script may still be queued behind the refund, so the
//!   refund is repeated for [`NOT_FOUND_WINDOW`] after the store first
//!   answered; then the reservation is taken as never made.
//! - The store still failing: retried with backoff until the reservation's
//!   record would have expired anyway (lease plus retention).
//!
//! The same holds for a CheckAndReserve dropped before its answer (a client
//! deadline, a reset stream): its `Reserved` (`engine/resilient.rs`) queues
//! its reservation.
//!
//! The queue holds at most [`CAPACITY`] reservations; past that a cancellation
//! is dropped, logged and counted (its lease still lapses by its TTL). A
//! reservation with an idempotency key is not cancelled when the caller will
//! retry with the key, which returns it: a dropped call, or UNAVAILABLE under
//! `fail_closed`. Under the degraded policies the caller got a local
//! reservation instead, so the one in the store is cancelled.

use super::Engine;
use crate::domain::ReservationId;
use crate::store::{SettleReply, Store};
use crate::telemetry;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Cancellations held at most.
pub(super) const CAPACITY: usize = 10_000;
/// How long a refund answered "not found" is repeated.
pub(super) const NOT_FOUND_WINDOW: Duration = Duration::from_secs(3);
/// The first retry's delay; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the worker looks for due cancellations.
const TICK: Duration = Duration::from_millis(50);

/// One reservation to cancel.
#[derive(Debug)]
struct Pending {
    id: ReservationId,
    /// No attempt before this.
    next_at: Instant,
    backoff: Duration,
    /// After this the reservation's record is gone: nothing left to cancel.
    give_up_at: Instant,
    /// When the store first answered "not found".
    not_found_since: Option<Instant>,
}

/// The queue of reservations to cancel.
#[derive(Debug, Default)]
pub(super) struct Cancellations {
    pending: Mutex<Vec<Pending>>,
}

impl Cancellations {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `id`, whose record lives for `record_life` at most.
    pub(super) fn push(&self, id: ReservationId, record_life: Duration) {
        let now = Instant::now();
        let mut pending = self.lock();
        if pending.len() >= CAPACITY {
            drop(pending);
            telemetry::cancellation("dropped");
            tracing::warn!(
                reservation = %id,
                "the cancellation queue is full ({CAPACITY}); this reservation's lease lapses by \
                 its TTL instead"
            );
            return;
        }
        pending.push(Pending {
            id,
            next_at: now,
            backoff: FIRST_BACKOFF,
            give_up_at: now + record_life,
            not_found_since: None,
        });
        telemetry::cancellations_pending(pending.len());
    }

    /// Takes every cancellation due now.
    fn take_due(&self, now: Instant) -> Vec<Pending> {
        let mut pending = self.lock();
        let (due, later) = std::mem::take(&mut *pending)
            .into_iter()
            .partition(|p| p.next_at <= now);
        *pending = later;
        due
    }

    /// Puts back cancellations to retry.
    fn put_back(&self, retry: Vec<Pending>) {
        let mut pending = self.lock();
        pending.extend(retry);
        telemetry::cancellations_pending(pending.len());
    }

    /// Cancellations waiting.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// What one attempt concluded.
enum Attempt {
    Done(&'static str),
    Retry,
}

impl<S: Store> Engine<S> {
    /// Works through the cancellation queue until the task is aborted; the
    /// server runs it in the background.
    pub async fn run_cancellations(&self) {
        loop {
            tokio::time::sleep(TICK).await;
            let due = self.budget.cancels.take_due(Instant::now());
            if due.is_empty() {
                continue;
            }
            let mut retry = Vec::new();
            for mut p in due {
                match self.cancel_once(&mut p).await {
                    Attempt::Done(outcome) => telemetry::cancellation(outcome),
                    Attempt::Retry => {
                        p.next_at = Instant::now() + p.backoff;
                        p.backoff = (p.backoff * 2).min(MAX_BACKOFF);
                        retry.push(p);
                    }
                }
            }
            self.budget.cancels.put_back(retry);
        }
    }

    /// Reservations waiting to be cancelled.
    pub fn cancellations_pending(&self) -> usize {
        self.budget.cancels.len()
    }

    async fn cancel_once(&self, p: &mut Pending) -> Attempt {
        let now = Instant::now();
        if now >= p.give_up_at {
            tracing::warn!(reservation = %p.id, "gave up cancelling: its record has expired");
            return Attempt::Done("expired");
        }
        match self.refund_id(&p.id).await {
            Ok((SettleReply::Applied { .. }, refunded)) => {
                tracing::info!(
                    reservation = %p.id,
                    refunded,
                    "cancelled a reservation its caller never received (its store call failed)"
                );
                Attempt::Done("cancelled")
            }
            // Nobody else has the id: an earlier attempt that timed out on
            // this side reached the store and applied.
            Ok((SettleReply::AlreadySettled(_), _)) => {
                tracing::info!(
                    reservation = %p.id,
                    "cancelled a reservation its caller never received (an earlier attempt applied)"
                );
                Attempt::Done("cancelled")
            }
            Ok((SettleReply::NotFound, _)) => {
                let since = *p.not_found_since.get_or_insert(now);
                if now.duration_since(since) >= NOT_FOUND_WINDOW {
                    Attempt::Done("not_found")
                } else {
                    Attempt::Retry
                }
            }
            Err(e) if e.is_transient() => Attempt::Retry,
            Err(e) => {
                tracing::error!(reservation = %p.id, error = %e, "cannot cancel a reservation");
                Attempt::Done("failed")
            }
        }
    }
}
