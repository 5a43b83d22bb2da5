//! The circuit breaker in front of the store. Closed, it lets every call through
//! and counts outcomes over a sliding window; when enough calls failed (a rate
//! over a threshold, with a minimum number of calls — one blip never trips it)
//! it opens: calls fail at once, without waiting on a store that is down. After
//! a cool-down a probe is due: the engine checks, off the request path, that
//! the store answers on every connection (a PING each, reconnecting those that
//! broke). Only then does it half-open: a bounded number of real calls go
//! through; consecutive successes close it, a failed call opens it again, as
//! does a failed probe. Real calls never probe a store that has not answered a
//! PING, so a recovering store is not judged by connections still reconnecting.

use crate::telemetry::BreakerGauge;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How the breaker trips and recovers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerSettings {
    /// The sliding window failures are counted over.
    pub window: Duration,
    /// Calls the window must hold before the breaker may open.
    pub min_calls: u32,
    /// Failure share of the window that opens the breaker (0-1).
    pub failure_rate: f64,
    /// How long it stays open before the store is probed (and between
    /// probes while they fail), plus up to a fifth more at random so replicas
    /// do not probe a recovering store in lockstep.
    pub cool_down: Duration,
    /// Real calls allowed at once while half-open.
    pub probes: u32,
    /// Consecutive probe successes that close it.
    pub close_after: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        BreakerSettings {
            window: Duration::from_secs(10),
            min_calls: 20,
            failure_rate: 0.5,
            cool_down: Duration::from_secs(1),
            probes: 3,
            close_after: 3,
        }
    }
}

/// The breaker's state, as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls flow.
    Closed,
    /// A few probe calls flow.
    HalfOpen,
    /// Calls fail at once.
    Open,
}

impl BreakerState {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::HalfOpen => "half_open",
            BreakerState::Open => "open",
        }
    }
}

impl From<BreakerState> for BreakerGauge {
    fn from(state: BreakerState) -> Self {
        match state {
            BreakerState::Closed => BreakerGauge::Closed,
            BreakerState::HalfOpen => BreakerGauge::HalfOpen,
            BreakerState::Open => BreakerGauge::Open,
        }
    }
}

/// Per-second outcome counts in the window.
const SLOTS: usize = 10;

/// (slot start, successes, failures), a ring of SLOTS.
type Slots = [(Option<Instant>, u32, u32); SLOTS];

#[derive(Debug)]
enum Inner {
    Closed {
        /// The window's outcome counts.
        slots: Box<Slots>,
    },
    Open {
        until: Instant,
    },
    /// Open, with a probe of the store under way.
    Probing,
    HalfOpen {
        in_flight: u32,
        successes: u32,
    },
}

/// The circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    settings: BreakerSettings,
    inner: Mutex<Inner>,
}

/// Permission for one call; report its outcome with [`Breaker::record`]. A
/// permit dropped unreported (the call's future was dropped: a client
/// deadline, a reset stream) gives its half-open slot back, so a recovering
/// store is never left with every probe slot taken.
#[derive(Debug)]
#[must_use = "report the call's outcome with Breaker::record"]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    reported: bool,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.reported || !self.probe {
            return;
        }
        if let Inner::HalfOpen { in_flight, .. } = &mut *self.breaker.lock() {
            *in_flight = in_flight.saturating_sub(1);
        }
    }
}

fn closed() -> Inner {
    Inner::Closed {
        slots: Box::new([(None, 0, 0); SLOTS]),
    }
}

impl Breaker {
    /// A closed breaker.
    pub fn new(settings: BreakerSettings) -> Self {
        Breaker {
            settings,
            inner: Mutex::new(closed()),
        }
    }

    /// The cool-down with its jitter.
    fn cool_down(&self) -> Duration {
        self.settings
            .cool_down
            .mul_f64(1.0 + rand::random_range(0.0..=0.2))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
            Inner::Open { .. } | Inner::Probing => BreakerState::Open,
        }
    }

    /// True once, when the breaker is open and its cool-down has passed: the
    /// caller probes the store and reports with [`Breaker::probe_result`].
    /// Calls keep failing at once while the probe runs.
    pub fn probe_due(&self) -> bool {
        let mut inner = self.lock();
        match *inner {
            Inner::Open { until } if Instant::now() >= until => {
                *inner = Inner::Probing;
                true
            }
            _ => false,
        }
    }

    /// Opens it with a probe due at once (the store was found unreachable
    /// before any call was made).
    pub fn trip(&self) {
        *self.lock() = Inner::Open {
            until: Instant::now(),
        };
    }

    /// The probe's outcome: the store answered (half-open: real calls may
    /// follow) or not (open for another cool-down).
    pub fn probe_result(&self, ok: bool) {
        let mut inner = self.lock();
        if !matches!(*inner, Inner::Probing) {
            return;
        }
        *inner = if ok {
            tracing::info!(
                "store circuit breaker half-open: the store answers a probe on every connection"
            );
            Inner::HalfOpen {
                in_flight: 0,
                successes: 0,
            }
        } else {
            tracing::debug!(
                "store circuit breaker: the store does not answer a probe yet; open again"
            );
            Inner::Open {
                until: Instant::now() + self.cool_down(),
            }
        };
    }

    /// Permission to call the store, or `None` while open (or while every
    /// half-open probe slot is taken).
    pub fn acquire(&self) -> Option<Permit<'_>> {
        let mut inner = self.lock();
        match &mut *inner {
            Inner::Closed { .. } => Some(Permit {
                breaker: self,
                probe: false,
                reported: false,
            }),
            Inner::Open { .. } | Inner::Probing => None,
            Inner::HalfOpen { in_flight, .. } => {
                if *in_flight < self.settings.probes {
                    *in_flight += 1;
                    Some(Permit {
                        breaker: self,
                        probe: true,
                        reported: false,
                    })
                } else {
                    None
                }
            }
        }
    }

    /// Reports a call's outcome (`ok`: the store answered).
    pub fn record(&self, mut permit: Permit<'_>, ok: bool) {
        permit.reported = true;
        let now = Instant::now();
        let mut inner = self.lock();
        let next = match &mut *inner {
            Inner::Closed { slots } => self.record_closed(slots, ok, now),
            Inner::HalfOpen {
                in_flight,
                successes,
            } => {
                if permit.probe {
                    *in_flight = in_flight.saturating_sub(1);
                }
                self.record_half_open(successes, ok, now)
            }
            Inner::Open { .. } | Inner::Probing => None,
        };
        if let Some(next) = next {
            *inner = next;
        }
    }

    /// Counts a call while closed; the open state when the window's failure
    /// rate calls for it.
    fn record_closed(&self, slots: &mut Slots, ok: bool, now: Instant) -> Option<Inner> {
        let index = current_slot(slots, now, self.settings.window / SLOTS as u32);
        if ok {
            slots[index].1 += 1;
        } else {
            slots[index].2 += 1;
        }
        let (mut calls, mut failures) = (0u32, 0u32);
        for (start, s, f) in slots.iter() {
            if start.is_some_and(|t| now.duration_since(t) < self.settings.window) {
                calls += s + f;
                failures += f;
            }
        }
        if calls < self.settings.min_calls
            || f64::from(failures) < self.settings.failure_rate * f64::from(calls)
        {
            return None;
        }
        tracing::warn!(
            failures,
            calls,
            "store circuit breaker opened: {failures} of the last {calls} calls failed"
        );
        Some(Inner::Open {
            until: now + self.cool_down(),
        })
    }

    /// Counts a probe call while half-open; the next state if it changes: open
    /// again on a failure, closed after enough successes.
    fn record_half_open(&self, successes: &mut u32, ok: bool, now: Instant) -> Option<Inner> {
        if !ok {
            tracing::warn!("store circuit breaker: a call failed while half-open; open again");
            return Some(Inner::Open {
                until: now + self.cool_down(),
            });
        }
        *successes += 1;
        if *successes < self.settings.close_after {
            return None;
        }
        tracing::info!("store circuit breaker closed: the store answers again");
        Some(closed())
    }
}

/// The slot a call at `now` counts in: the newest while it is younger than
/// `slot_len` (a tenth of the window), else the next one, restarted (the
/// oldest falls out).
fn current_slot(slots: &mut Slots, now: Instant, slot_len: Duration) -> usize {
    let newest = slots.iter().filter_map(|s| s.0).max();
    match newest {
        Some(start) if now.duration_since(start) < slot_len => {
            slots.iter().position(|s| s.0 == Some(start)).unwrap_or(0)
        }
        Some(start) => {
            let i = slots.iter().position(|s| s.0 == Some(start)).unwrap_or(0);
            let next = (i + 1) % SLOTS;
            slots[next] = (Some(now), 0, 0);
            next
        }
        None => {
            slots[0] = (Some(now), 0, 0);
            0
        }
    }
}

#[cfg(test)]
mod tests;
