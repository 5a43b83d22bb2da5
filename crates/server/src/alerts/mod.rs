//! Threshold alerts' delivery. Reserve and settle queue a crossing in the
//! store, in the same atomic step as the call that made it
//! (`domain::budget::alerts`); every replica runs a [`run`] loop that claims
//! the queued alerts that are due (a claim keeps other replicas off one for a
//! while, and lapses if its replica dies), POSTs each to `[alerts]
//! webhook_url` ([`webhook`]), and then logs it, counts it
//! (`ctxbudget_alerts_total`) and keeps it among the recent ones (`ctxbudget
//! alerts list`). A POST that fails is tried again after a backoff that
//! doubles up to `max_backoff_ms`; an alert older than `max_age` is given up
//! and counted. Delivery is at least once: a replica that dies between a
//! receiver's 2xx and the queue's update leaves the alert to be sent again,
//! under the same `x-ctxbudget-event-id`.
//!
//! - [`event`]: the JSON body of one alert.
//! - [`webhook`]: the signed POST.

pub mod event;
pub mod webhook;

use crate::config::AlertSettings;
use crate::domain::{Clock, Limits, SystemClock};
use crate::engine::Engine;
use crate::store::keys::Keys;
use crate::store::{AlertDone, QueuedAlert, Store};
use crate::telemetry;
use event::Event;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a replica looks for due alerts.
pub const POLL: Duration = Duration::from_millis(250);
/// POSTs in flight at once, per replica: as many as it claims at a time, so
/// every claimed alert is tried within its claim.
const IN_FLIGHT: usize = 16;
/// Alerts kept for `ctxbudget alerts list`.
pub const RECENT: usize = 200;
/// How long a replica waits to look for unindexed queues again when the
/// store did not answer.
const REINDEX_RETRY: Duration = Duration::from_secs(30);
/// The first retry's wait; each later one doubles it (to `max_backoff`).
const FIRST_BACKOFF_MS: u64 = 500;

/// Sends the alerts `engine`'s store queues, under the settings `settings`
/// holds (they change on a reload), naming levels by `keys`.
pub async fn run<S: Store>(
    engine: Arc<Engine<S>>,
    keys: Keys,
    settings: watch::Receiver<AlertSettings>,
) {
    let client = webhook::client();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    // Once, as soon as the store answers: queues the index lacks.
    let mut reindex_at = Some(tokio::time::Instant::now());
    loop {
        tick.tick().await;
        if reindex_at.is_some_and(|at| at <= tokio::time::Instant::now()) {
            reindex_at = reindex(engine.store()).await;
        }
        let s = settings.borrow().clone();
        let claim_ms = 2 * s.timeout.as_millis() as u64 + 1_000;
        let claimed = match engine.store().claim_alerts(IN_FLIGHT, claim_ms).await {
            Ok(c) => {
                failing = false;
                c
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the alert queues; trying again");
                }
                failing = true;
                continue;
            }
        };
        let limits = engine.limits();
        let sender = Sending {
            store: engine.store(),
            keys: &keys,
            limits: &limits,
            settings: &s,
            client: &client,
        };
        futures_util::stream::iter(claimed)
            .for_each_concurrent(IN_FLIGHT, |a| sender.send(a))
            .await;
    }
}

/// Indexes the queues holding alerts (on a Redis Cluster, a replica that
/// died between a crossing and indexing its queue leaves it out). `None`
/// once done; when the store did not answer, when to try again.
async fn reindex<S: Store>(store: &S) -> Option<tokio::time::Instant> {
    match store.reindex_alerts().await {
        Ok(0) => None,
        Ok(n) => {
            tracing::info!(queues = n, "alert queues holding alerts indexed");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot look for alert queues to index yet");
            Some(tokio::time::Instant::now() + REINDEX_RETRY)
        }
    }
}

/// One round's sending.
struct Sending<'a, S> {
    store: &'a S,
    keys: &'a Keys,
    limits: &'a Limits,
    settings: &'a AlertSettings,
    client: &'a reqwest::Client,
}

impl<S: Store> Sending<'_, S> {
    /// Sends one claimed alert and says what became of it.
    async fn send(&self, alert: QueuedAlert) {
        let done = self.deliver(&alert).await;
        if let Err(e) = self.store.finish_alert(&alert, done).await {
            // The claim lapses and another try (here or elsewhere) follows.
            tracing::warn!(error = %e, event_id = %alert.id, "cannot update the alert queue");
        }
    }

    async fn deliver(&self, alert: &QueuedAlert) -> AlertDone {
        let Some(event) = Event::of(alert, self.keys, self.limits) else {
            tracing::warn!(event_id = %alert.id, queue = %alert.queue, "an unreadable alert record: dropped");
            telemetry::alert_dropped("unreadable");
            return AlertDone::Dropped;
        };
        let age_us = SystemClock.now_us() as f64 - event.at_us;
        if age_us > self.settings.max_age.as_micros() as f64 {
            tracing::warn!(
                event_id = %event.event_id,
                tenant = event.tenant.as_deref().unwrap_or(""),
                attempts = alert.attempts,
                "a threshold alert not delivered within max_age: dropped"
            );
            telemetry::alert_dropped("too_old");
            self.note(&event, "dropped", alert.attempts).await;
            return AlertDone::Dropped;
        }
        let status = match &self.settings.webhook_url {
            None => "logged",
            Some(url) => {
                let secret = self.settings.secret.as_deref();
                let posted =
                    webhook::post(self.client, url, secret, self.settings.timeout, &event).await;
                if let Err(e) = posted {
                    telemetry::alert_failed(e.reason());
                    let after_ms = backoff_ms(alert.attempts, self.settings.max_backoff);
                    tracing::warn!(
                        event_id = %event.event_id,
                        attempts = alert.attempts,
                        retry_in_ms = after_ms,
                        error = %e,
                        "a threshold alert was not delivered; it will be tried again"
                    );
                    return AlertDone::Retry { after_ms };
                }
                "delivered"
            }
        };
        tracing::warn!(
            event_id = %event.event_id,
            tenant = event.tenant.as_deref().unwrap_or(""),
            user = event.user.as_deref().unwrap_or(""),
            session = event.session.as_deref().unwrap_or(""),
            level = event.level,
            model_group = event.model_group.as_deref().unwrap_or(""),
            dimension = event.limit.dimension,
            limit = event.limit.limit,
            usage = event.usage,
            threshold = event.threshold,
            status,
            "threshold alert: {}% of a {} limit used",
            crate::domain::alert::percent(event.threshold),
            event.limit.dimension
        );
        telemetry::alert(event.level, event.limit.dimension);
        self.note(&event, status, alert.attempts).await;
        AlertDone::Sent
    }

    /// Keeps the alert among the recent ones, with what became of it.
    async fn note(&self, event: &Event, status: &str, attempts: u64) {
        let mut line = serde_json::to_value(event).unwrap_or_default();
        line["status"] = status.into();
        line["attempts"] = attempts.into();
        line["at"] = event::rfc3339(SystemClock.now_us() as f64).into();
        if let Err(e) = self.store.note_alert(line.to_string(), RECENT).await {
            tracing::debug!(error = %e, "could not keep a recent alert");
        }
    }
}

/// The wait before try `attempts + 1`: 0.5 s doubling per try, at most
/// `max`, give or take a fifth (so replicas' retries spread).
fn backoff_ms(attempts: u64, max: Duration) -> u64 {
    let doubled = FIRST_BACKOFF_MS.saturating_mul(1 << attempts.saturating_sub(1).min(20));
    let capped = doubled.min(max.as_millis() as u64) as f64;
    (capped * rand::random_range(0.8..1.2)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let cap = Duration::from_secs(10);
        let b = |n| backoff_ms(n, cap);
        assert!((400..=600).contains(&b(1)), "{}", b(1));
        assert!((800..=1200).contains(&b(2)));
        assert!((8_000..=12_000).contains(&b(10)));
        assert!((8_000..=12_000).contains(&b(u64::MAX)));
    }
}
