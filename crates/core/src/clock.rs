//! Time for the in-memory store. Redis reads its own `TIME` inside the scripts, so
//! one clock rules every replica; the memory store takes a [`Clock`] so tests can
//! move time by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// The current time in microseconds since the Unix epoch.
    fn now_us(&self) -> i64;
}

/// The wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or_default()
    }
}

/// A clock that moves only when told to; clones share one time.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock starting at `now_us`.
    pub fn new(now_us: i64) -> Self {
        ManualClock(Arc::new(AtomicI64::new(now_us)))
    }

    /// Moves time forward by `us` microseconds.
    pub fn advance_us(&self, us: i64) {
        self.0.fetch_add(us, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
