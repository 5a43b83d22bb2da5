//! The memory store's sample lists: what settle.lua keeps in Redis lists
//! (estimator samples, completions), newest first and capped.

use super::expiry;
use crate::domain::layout::{OUTPUT_TRIM_SLACK, SAMPLES_TTL_MS};
use std::collections::{HashMap, VecDeque};

/// Pushes `sample` on the list `key` as settle.lua does (estimator samples
/// and completions alike): newest first, trimmed to `window` and its life
/// renewed only when the list is new or [`OUTPUT_TRIM_SLACK`] longer than
/// `window` (readers take the newest `window`).
pub(super) fn push_trimmed<T>(
    lists: &mut HashMap<String, (VecDeque<T>, i64)>,
    key: String,
    sample: T,
    window: usize,
    now: i64,
) {
    let (samples, expires_at) = lists.entry(key).or_default();
    if *expires_at <= now {
        // The list expired (Redis would have dropped it): start anew.
        samples.clear();
    }
    samples.push_front(sample);
    if samples.len() == 1 || samples.len() > window + OUTPUT_TRIM_SLACK {
        samples.truncate(window.max(1));
        *expires_at = expiry(now, SAMPLES_TTL_MS);
    }
}

/// The list `key` holds at `now`, newest first (none once expired).
pub(super) fn read<T: Copy>(
    lists: &HashMap<String, (VecDeque<T>, i64)>,
    key: &str,
    now: i64,
) -> Vec<T> {
    lists
        .get(key)
        .filter(|(_, exp)| *exp > now)
        .map_or_else(Vec::new, |(s, _)| s.iter().copied().collect())
}
