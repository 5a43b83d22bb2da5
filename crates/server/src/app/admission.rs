//! The admission gate: at most `[server] max_in_flight` decisions are worked
//! on at once, over every transport (gRPC's budget and Envoy services, the
//! HTTP API); a decision that finds them all busy waits at most `queue_ms` (or
//! half its own deadline, if less) for one to free, and is otherwise shed with
//! an error that says when to retry, before any of its work starts. Each
//! front door takes its slot at its earliest point (gRPC before decoding,
//! HTTP before reading the body), from this one gate.

use super::error::{AppError, ErrorKind};
use crate::config::AdmissionSettings;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The slots every admitted call shares, across connections and services.
pub struct Gate {
    slots: Arc<Semaphore>,
    settings: AdmissionSettings,
    /// The calls in flight, as the gauge reports them: counted and reported
    /// under one lock, so the gauge's last value is the count's last value
    /// (a count read apart from its report could be overwritten by an older
    /// one on another thread, and stay wrong while nothing else changes).
    busy: Mutex<usize>,
}

impl Gate {
    /// A gate of `settings.max_in_flight` slots.
    pub fn new(settings: AdmissionSettings) -> Arc<Self> {
        crate::telemetry::in_flight_limit(settings.max_in_flight);
        Arc::new(Gate {
            slots: Arc::new(Semaphore::new(settings.max_in_flight)),
            settings,
            busy: Mutex::new(0),
        })
    }

    /// The refusal of a call that found no slot in time; `deadline`: its
    /// own deadline ran out first.
    pub fn shed(&self, deadline: bool) -> AppError {
        let s = &self.settings;
        let error = match deadline {
            true => {
                crate::telemetry::shed("deadline");
                AppError::new(
                    ErrorKind::DeadlineExceeded,
                    format!(
                        "half the call's deadline passed while it waited for one of the \
                         {} calls in flight to finish ([server] max_in_flight), too little \
                         to be served in; nothing was done: retry with a longer deadline, \
                         or later",
                        s.max_in_flight
                    ),
                )
            }
            false => {
                crate::telemetry::shed("full");
                AppError::new(
                    ErrorKind::Exhausted,
                    format!(
                        "the service is at its limit of {} calls in flight ([server] \
                         max_in_flight) and none finished within {} ms; nothing was \
                         done: retry after {} ms",
                        s.max_in_flight,
                        s.queue.as_millis(),
                        s.retry_ms
                    ),
                )
            }
        };
        // A client retrying by policy waits this long (gRPC's retry
        // pushback, HTTP's Retry-After).
        error.retry_after(s.retry_ms)
    }
}

impl Gate {
    /// A slot, waited for as the module says (`deadline`: the call's own),
    /// or the refusal of a call shed. The slot frees when the permit drops.
    pub async fn admit(self: &Arc<Self>, deadline: Option<Duration>) -> Result<Permit, AppError> {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let queue = self.settings.queue;
                let wait = deadline.map_or(queue, |d| (d / 2).min(queue));
                match tokio::time::timeout(wait, self.slots.clone().acquire_owned()).await {
                    Ok(Ok(permit)) => permit,
                    _ => {
                        let ran_out = deadline.is_some_and(|d| d / 2 <= queue);
                        return Err(self.shed(ran_out));
                    }
                }
            }
        };
        self.count(1);
        Ok(Permit {
            _permit: permit,
            gate: self.clone(),
        })
    }

    /// What the gate was built with.
    pub fn settings(&self) -> &AdmissionSettings {
        &self.settings
    }

    /// Counts `delta` calls more (or fewer) in flight and reports the count.
    fn count(&self, delta: isize) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        *busy = busy.saturating_add_signed(delta);
        crate::telemetry::in_flight(*busy);
    }
}

/// One admitted call's slot; dropping it frees the slot.
pub struct Permit {
    _permit: OwnedSemaphorePermit,
    gate: Arc<Gate>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.count(-1);
    }
}

/// An admitted call's slot, which the call gives back early when it stops
/// working and starts waiting in line for the shared account: a waiting
/// call holds no slot, so waiting calls never shed working ones.
pub struct Slot(Mutex<Option<Permit>>);

impl Slot {
    /// Holds `permit`.
    pub fn new(permit: Permit) -> Self {
        Slot(Mutex::new(Some(permit)))
    }

    /// Gives the slot back (once; later calls do nothing).
    pub fn release(&self) {
        let permit = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(permit);
    }
}

#[cfg(test)]
mod tests;
