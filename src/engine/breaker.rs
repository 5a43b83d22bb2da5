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

pub use crate::config::BreakerSettings;
use crate::telemetry::BreakerGauge;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

#[derive(Debug)]
enum Inner {
    Closed {
        /// (slot start, successes, failures), a ring of SLOTS.
        slots: Box<[(Option<Instant>, u32, u32); SLOTS]>,
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
        match &mut *inner {
            Inner::Closed { slots } => {
                let slot_len = self.settings.window / SLOTS as u32;
                // The newest slot while it is younger than a tenth of the
                // window, else the next one, restarted (the oldest falls out).
                let index = {
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
                };
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
                if calls >= self.settings.min_calls
                    && f64::from(failures) >= self.settings.failure_rate * f64::from(calls)
                {
                    tracing::warn!(
                        failures,
                        calls,
                        "store circuit breaker opened: {failures} of the last {calls} calls failed"
                    );
                    *inner = Inner::Open {
                        until: now + self.cool_down(),
                    };
                }
            }
            Inner::HalfOpen {
                in_flight,
                successes,
            } => {
                if permit.probe {
                    *in_flight = in_flight.saturating_sub(1);
                }
                if !ok {
                    tracing::warn!(
                        "store circuit breaker: a call failed while half-open; open again"
                    );
                    *inner = Inner::Open {
                        until: now + self.cool_down(),
                    };
                } else {
                    *successes += 1;
                    if *successes >= self.settings.close_after {
                        tracing::info!("store circuit breaker closed: the store answers again");
                        *inner = closed();
                    }
                }
            }
            Inner::Open { .. } | Inner::Probing => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> BreakerSettings {
        BreakerSettings {
            window: Duration::from_secs(10),
            min_calls: 4,
            failure_rate: 0.5,
            cool_down: Duration::from_millis(200),
            probes: 1,
            close_after: 2,
        }
    }

    fn call(b: &Breaker, ok: bool) -> bool {
        match b.acquire() {
            Some(p) => {
                b.record(p, ok);
                true
            }
            None => false,
        }
    }

    #[test]
    fn one_blip_does_not_open_but_a_failure_rate_does() {
        let b = Breaker::new(quick());
        assert!(call(&b, false));
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "below the minimum number of calls"
        );
        assert!(call(&b, true));
        assert!(call(&b, true));
        assert!(call(&b, true));
        assert_eq!(
            b.state(),
            BreakerState::Closed,
            "1 failure in 4 is below 50%"
        );
        assert!(call(&b, false));
        assert!(call(&b, false));
        assert_eq!(b.state(), BreakerState::Open, "3 of 6 failed");
        assert!(b.acquire().is_none(), "open: calls fail at once");
    }

    #[test]
    fn the_cool_down_jitter_stays_within_a_fifth() {
        let b = Breaker::new(quick());
        let base = quick().cool_down;
        let samples: Vec<Duration> = (0..200).map(|_| b.cool_down()).collect();
        assert!(
            samples
                .iter()
                .all(|d| *d >= base && *d <= base.mul_f64(1.2))
        );
        assert!(
            samples.iter().any(|d| *d != samples[0]),
            "jittered, not constant"
        );
    }

    #[test]
    fn a_dropped_half_open_call_gives_its_slot_back() {
        let b = Breaker::new(quick());
        b.trip();
        assert!(b.probe_due());
        b.probe_result(true);
        let abandoned = b.acquire().expect("the one half-open slot");
        assert!(b.acquire().is_none(), "the slot is taken");
        drop(abandoned); // its call's future was dropped, unreported
        assert!(call(&b, true), "the slot is free again");
        assert!(call(&b, true));
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn it_probes_the_store_before_half_opening_and_closes_or_reopens() {
        let b = Breaker::new(quick());
        for _ in 0..4 {
            call(&b, false);
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.probe_due(), "no probe during the cool-down");
        std::thread::sleep(Duration::from_millis(260)); // cool-down 200 ms + ≤ 20 %
        assert_eq!(b.state(), BreakerState::Open, "open until a probe answers");
        assert!(b.probe_due(), "a probe is due after the cool-down");
        assert!(!b.probe_due(), "one probe at a time");
        assert!(b.acquire().is_none(), "calls fail at once while it probes");
        b.probe_result(false);
        assert_eq!(b.state(), BreakerState::Open, "a failed probe: open again");
        assert!(!b.probe_due(), "and a new cool-down");
        std::thread::sleep(Duration::from_millis(260));
        assert!(b.probe_due());
        b.probe_result(true);
        assert_eq!(b.state(), BreakerState::HalfOpen, "the store answered");
        let probe = b.acquire().expect("one real call");
        assert!(b.acquire().is_none(), "half-open calls are bounded");
        b.record(probe, false);
        assert_eq!(
            b.state(),
            BreakerState::Open,
            "a failed call opens it again"
        );
        std::thread::sleep(Duration::from_millis(260));
        assert!(b.probe_due());
        b.probe_result(true);
        assert!(call(&b, true));
        assert_eq!(
            b.state(),
            BreakerState::HalfOpen,
            "one success is not enough"
        );
        assert!(call(&b, true));
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
