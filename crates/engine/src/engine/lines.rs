//! This replica's side of the lines of waiting calls (the lines themselves
//! are the store's: [`crate::store::LineStore`]): which of its callers hold
//! which tickets, what it knows of the lines other replicas wait in, and the
//! background loop, [`Engine::run_lines`], that
//!
//! - takes tickets out of their lines when their calls end (a grant, or a
//!   caller that left: a ticket's drop cannot wait for the store);
//! - wakes the lines after a Commit or Refund of this replica (room may have
//!   come), the ones its callers wait in and the ones the other replicas
//!   said have calls waiting;
//! - beats once a second for the lines its callers wait in: its tickets are
//!   not taken for a dead replica's, and a first ticket whose owner died is
//!   dropped and the next woken;
//! - hears the other replicas (a ticket of its own is first: wake it; a line
//!   has calls waiting).

use super::Engine;
use crate::domain::budget::level::FastMap;
use crate::store::Store;
use crate::store::line::{Leave, LineMessage, LineView, Ticket, owner_of};
use futures_util::StreamExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// How often a replica beats for the lines its callers wait in.
const BEAT: Duration = Duration::from_secs(1);
/// How long what another replica said of a line counts.
const HEARD_FOR: Duration = Duration::from_secs(3);

/// This replica's tickets and what it heard of the other replicas' lines.
pub(super) struct Queues {
    /// This replica in ticket ids: random, so a restarted replica is another.
    pub(super) owner: String,
    /// Tickets of this replica's waiting callers, and what wakes each.
    tickets: Mutex<FastMap<String, (Ticket, Arc<Notify>)>>,
    /// Calls waiting here, kept beside them so that a Commit or Refund with
    /// nobody waiting anywhere takes no lock.
    waiting: AtomicUsize,
    /// Lines other replicas said have calls waiting: how many, and when.
    heard: Mutex<FastMap<String, (usize, Instant)>>,
    heard_any: AtomicBool,
    /// Tickets to take out of their lines.
    leaving: Mutex<Vec<(Ticket, Leave)>>,
    /// Wakes the loop: tickets to take out, or room to announce.
    kick: Notify,
    room: AtomicBool,
}

impl Default for Queues {
    fn default() -> Self {
        Queues {
            owner: format!("{:016x}", rand::random::<u64>()),
            tickets: Mutex::default(),
            waiting: AtomicUsize::new(0),
            heard: Mutex::default(),
            heard_any: AtomicBool::new(false),
            leaving: Mutex::default(),
            kick: Notify::new(),
            room: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Queues {
    /// Room may have come back (a Commit or Refund): the loop wakes the
    /// lines. Nothing when no call waits, here or as far as this replica heard.
    pub(super) fn room(&self) {
        if self.waiting() == 0 && !self.heard_any.load(Ordering::Relaxed) {
            return;
        }
        self.room.store(true, Ordering::Relaxed);
        self.kick.notify_one();
    }

    /// Calls waiting here.
    pub(super) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Holds `ticket` for a caller; what wakes it.
    pub(super) fn hold(&self, ticket: &Ticket) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        let mut tickets = lock(&self.tickets);
        tickets.insert(ticket.id.clone(), (ticket.clone(), notify.clone()));
        self.count(tickets.len());
        notify
    }

    /// The caller of `ticket` is done: the loop takes it out of its line.
    pub(super) fn release(&self, ticket: &Ticket, how: Leave) {
        {
            let mut tickets = lock(&self.tickets);
            tickets.remove(&ticket.id);
            self.count(tickets.len());
        }
        lock(&self.leaving).push((ticket.clone(), how));
        self.kick.notify_one();
    }

    /// `n` calls wait here now: kept, and published, under the tickets'
    /// lock, so the gauge ends on the last count.
    fn count(&self, n: usize) {
        self.waiting.store(n, Ordering::Relaxed);
        crate::telemetry::queue_waiting(n);
    }

    /// Wakes the caller of `ticket` if it is this replica's.
    fn wake(&self, ticket: &str) {
        if let Some((_, notify)) = lock(&self.tickets).get(ticket) {
            notify.notify_one();
        }
    }

    /// Wakes the first ticket of `view` if it is this replica's, and notes
    /// how many wait in `line`.
    fn saw(&self, line: &str, view: &LineView) {
        if let Some(first) = view.first.as_deref().filter(|f| owner_of(f) == self.owner) {
            self.wake(first);
        }
        self.heard(line, view.waiting);
    }

    fn heard(&self, line: &str, waiting: usize) {
        let mut heard = lock(&self.heard);
        match waiting {
            0 => drop(heard.remove(line)),
            n => drop(heard.insert(line.to_owned(), (n, Instant::now()))),
        }
        heard.retain(|_, (_, at)| at.elapsed() < HEARD_FOR);
        self.heard_any.store(!heard.is_empty(), Ordering::Relaxed);
    }

    /// The lines to wake: this replica's callers', and the ones others said
    /// have calls waiting.
    fn lines(&self, with_heard: bool) -> Vec<String> {
        let mut lines: Vec<String> = lock(&self.tickets)
            .values()
            .map(|(t, _)| t.line.clone())
            .collect();
        if with_heard {
            let heard = lock(&self.heard);
            lines.extend(
                heard
                    .iter()
                    .filter(|(_, (_, at))| at.elapsed() < HEARD_FOR)
                    .map(|(l, _)| l.clone()),
            );
        }
        lines.sort_unstable();
        lines.dedup();
        lines
    }
}

impl<S: Store> Engine<S> {
    /// The lines' background loop (module docs); runs until the task is
    /// aborted.
    pub async fn run_lines(&self) {
        let q = &self.queues;
        let mut messages = self.store().line_messages().await;
        let mut beat = tokio::time::interval(BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = async {
                match messages.as_mut() {
                    Some(m) => m.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = q.kick.notified() => {
                    self.leave_lines().await;
                    if q.room.swap(false, Ordering::Relaxed) {
                        self.wake_lines(true).await;
                    }
                }
                _ = beat.tick() => {
                    self.wake_lines(false).await;
                    if messages.is_none() {
                        messages = self.store().line_messages().await;
                    }
                }
                m = message => match m {
                    Some(LineMessage::Wake(ticket)) => q.wake(&ticket),
                    Some(LineMessage::Waiting { line, waiting }) => q.heard(&line, waiting),
                    None => messages = None,
                },
            }
        }
    }

    /// Takes the tickets of finished calls out of their lines.
    async fn leave_lines(&self) {
        let q = &self.queues;
        let leaving = std::mem::take(&mut *lock(&q.leaving));
        for (ticket, how) in leaving {
            match self.store().leave(&ticket, &q.owner, how).await {
                Ok(view) => q.saw(&ticket.line, &view),
                // Its deadline drops it from the line.
                Err(e) => tracing::debug!(error = %e, "a ticket could not leave its line"),
            }
        }
    }

    /// Wakes the lines this replica's callers wait in (and, with `heard`,
    /// the ones others said have calls waiting).
    async fn wake_lines(&self, heard: bool) {
        let q = &self.queues;
        for line in q.lines(heard) {
            match self.store().wake(&line, &q.owner).await {
                Ok(view) => q.saw(&line, &view),
                Err(e) => tracing::debug!(error = %e, "a line could not be woken"),
            }
        }
    }
}
