//! The threshold-alert queue as a sender sees it: the alerts a store holds
//! for delivery, claimed a while so no other replica sends them meanwhile,
//! and what became of each (`engine::alerts` sends them).

/// One queued alert, claimed.
#[derive(Clone, Debug, PartialEq)]
pub struct QueuedAlert {
    /// The tenant's queue it waits in (its key).
    pub queue: String,
    /// Its event id: the same on every try.
    pub id: String,
    /// Its record (`domain::alert::AlertRecord::decode`).
    pub record: Vec<u8>,
    /// Tries so far, this one included.
    pub attempts: u64,
}

/// What became of a claimed alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertDone {
    /// Delivered (or no receiver): it leaves the queue.
    Sent,
    /// Not delivered: tried again after this long.
    Retry {
        /// The wait (ms).
        after_ms: u64,
    },
    /// Given up (too old, or unreadable): it leaves the queue, counted.
    Dropped,
}

/// What the queues hold: every queued alert (claimed or not), and how many
/// were ever dropped (a full queue, or given up).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AlertBacklog {
    /// Queued alerts, with the tries made so far.
    pub queued: Vec<QueuedAlert>,
    /// Alerts dropped.
    pub dropped: u64,
}
