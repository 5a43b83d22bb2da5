//! Waiting in line for a shared level: a CheckAndReserve with `max_wait`
//! that only the global level (the upstream account, or a model group's
//! limits there) denies joins that level's line, which the store keeps
//! ([`crate::store::LineStore`]: every replica sharing the store waits in the
//! same line, in the fair order of [`crate::domain::queue::FairQueue`]).
//! The ticket first in line is retried at the refill time its last denial
//! computed, or when it is woken: a Commit or Refund on any replica, or the
//! ticket before it leaving. It is granted by the same atomic reserve as any
//! call, so nothing goes over a limit; it gets its last denial when its time
//! runs out. A caller that goes away drops its wait, and its ticket leaves
//! the line (`lines`); a grant being made as it went is refunded by the
//! store layer's cancel on drop (`engine/cancel.rs`), as for any call.
//!
//! A call's first attempt is an ordinary reserve: a gateway that sets
//! `max_wait` on every call pays one store call while the account has room.

use super::{Engine, EngineError, ReserveOutcome};
use crate::domain::plan::ReserveRequest;
use crate::domain::queue::class_of;
use crate::store::Store;
use crate::store::line::{Joined, Joining, Leave, Ticket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A caller's ticket; dropped, it leaves its line (granted or withdrawn).
struct Held<'a> {
    queues: &'a super::lines::Queues,
    ticket: Ticket,
    notify: Arc<Notify>,
    how: Leave,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.queues.release(&self.ticket, self.how);
    }
}

/// Why a call cannot wait in line.
enum Cannot {
    /// The line holds `[queue] max_queued` calls.
    Full,
    /// The store could not be asked.
    Failed,
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
struct Gone {
    started: Instant,
    armed: bool,
}

impl Drop for Gone {
    fn drop(&mut self) {
        if self.armed {
            crate::telemetry::queue_wait("cancelled", self.started.elapsed().as_secs_f64());
        }
    }
}

/// How a wait ended, for `ctxbudget_queue_wait_seconds`.
fn outcome_of(out: &Result<ReserveOutcome, EngineError>) -> &'static str {
    match out {
        Ok(o) if o.denial.is_none() => "granted",
        Ok(o) if o.waitable => "expired",
        Ok(_) => "denied",
        Err(_) => "failed",
    }
}

impl<S: Store> Engine<S> {
    /// [`Engine::reserve`], waiting in line up to `max_wait` when only a
    /// shared level denies the call (module docs); `waiting` runs when it
    /// joins the line (its caller gives back what it holds while it waits).
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
        let (ticket, is_first) = match self.join_line(&req, &line, &first, deadline).await {
            Ok(joined) => joined,
            Err(Cannot::Full) => return Ok(full(first, self.settings.max_queued)),
            Err(Cannot::Failed) => return Ok(first),
        };
        let held = Held {
            queues: &self.queues,
            notify: self.queues.hold(&ticket),
            ticket,
            how: Leave::Withdrawn,
        };
        waiting();
        let mut gone = Gone {
            started,
            armed: true,
        };
        let out = self
            .wait_in_line(req, first, held, is_first, deadline)
            .await;
        gone.armed = false;
        let waited = started.elapsed();
        crate::telemetry::queue_wait(outcome_of(&out), waited.as_secs_f64());
        out.map(|mut o| {
            o.waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
            o
        })
    }

    /// Joins `line` for `req`, whose denial is `first`; its ticket and
    /// whether it is first in line, or why it cannot wait (`first` then
    /// answers).
    async fn join_line(
        &self,
        req: &ReserveRequest,
        line: &str,
        first: &ReserveOutcome,
        deadline: Instant,
    ) -> Result<(Ticket, bool), Cannot> {
        // The tenant's weight: its tier's, or its override's.
        let tier = self.resolve_tier(&self.limits(), &req.tier, req.tenant.as_str());
        let joining = Joining {
            line,
            owner: &self.queues.owner,
            class: class_of(req.priority),
            tenant: req.tenant.as_str(),
            weight: tier.map_or(1, |t| t.weight).max(1),
            cost: first.reserved_tokens.max(1),
            wait_us: u64::try_from(
                deadline
                    .saturating_duration_since(Instant::now())
                    .as_micros(),
            )
            .unwrap_or(u64::MAX),
            most: self.settings.max_queued,
        };
        match self.store().join(&joining).await {
            Ok(Joined::Waiting { ticket, first }) => Ok((ticket, first)),
            Ok(Joined::Full { .. }) => {
                crate::telemetry::queue_wait("full", 0.0);
                Err(Cannot::Full)
            }
            Err(e) => {
                // No line to wait in: the denial, as without one.
                tracing::debug!(error = %e, "could not join the line; answering the denial");
                crate::telemetry::queue_wait("failed", 0.0);
                Err(Cannot::Failed)
            }
        }
    }

    /// Waits with `held` until the call is granted, denied elsewhere, or
    /// `deadline` passes (its last denial, `last`, then answers). `first`:
    /// the ticket was first in line when it joined.
    async fn wait_in_line(
        &self,
        req: ReserveRequest,
        mut last: ReserveOutcome,
        mut held: Held<'_>,
        mut first: bool,
        deadline: Instant,
    ) -> Result<ReserveOutcome, EngineError> {
        loop {
            let retry_ms = last.denial.as_ref().map_or(0, |d| d.retry_after_ms);
            let wake = match first {
                true => (Instant::now() + Duration::from_millis(retry_ms.max(1))).min(deadline),
                false => deadline,
            };
            let _ = tokio::time::timeout_at(wake.into(), held.notify.notified()).await;
            if Instant::now() >= deadline {
                return Ok(last);
            }
            // A newcomer may have joined ahead, or the ticket been dropped.
            let standing = match self
                .store()
                .standing(&held.ticket, &self.queues.owner)
                .await
            {
                Ok(s) => s,
                Err(_) => return Ok(last),
            };
            if !standing.waiting {
                return Ok(last);
            }
            first = standing.first;
            if !first {
                continue;
            }
            let out = Box::pin(self.reserve(req.clone())).await?;
            match (&out.denial, out.waitable) {
                (None, _) => {
                    held.how = Leave::Granted;
                    return Ok(out);
                }
                (Some(_), true) => last = out,
                (Some(_), false) => return Ok(out),
            }
        }
    }
}
