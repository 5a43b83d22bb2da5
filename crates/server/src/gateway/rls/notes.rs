//! What ShouldRateLimit logs once: a domain it does not serve, a descriptor
//! that maps to no tenant. Bounded, so hostile input cannot grow it.

use crate::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use std::collections::HashSet;
use std::sync::Mutex;

/// What was logged once already (bounded: hostile input cannot grow it).
static NOTED: Mutex<Option<HashSet<String>>> = Mutex::new(None);
const NOTED_CAP: usize = 1000;

/// True the first time `what` is seen.
fn first_time(what: String) -> bool {
    let mut noted = NOTED.lock().unwrap_or_else(|e| e.into_inner());
    let noted = noted.get_or_insert_with(HashSet::new);
    noted.len() < NOTED_CAP && noted.insert(what)
}

/// Logs once per domain that requests for a domain not served are answered OK.
pub(super) fn note_other_domain(domain: &str, served: &str) {
    let shown: String = domain.chars().take(64).collect();
    if first_time(format!("domain\0{shown}")) {
        tracing::warn!(
            domain = %shown,
            served,
            "rate limit requests for domain {shown:?} are answered OK with no limit: this \
             service serves domain {served:?} (set [envoy] domain, or the filter's domain; \
             ctxbudget_envoy_descriptors_total{{outcome=\"other_domain\"}} counts them)"
        );
    }
}

/// Logs once per set of entry keys that a descriptor mapping to nothing is
/// answered OK.
pub(super) fn note_unmapped(d: &RateLimitDescriptor) {
    let keys: Vec<String> = d
        .entries
        .iter()
        .take(16)
        .map(|e| e.key.chars().take(64).collect())
        .collect();
    let keys = keys.join(",");
    if first_time(format!("keys\0{keys}")) {
        tracing::warn!(
            keys = %keys,
            "a descriptor with the entry keys [{keys}] names no tenant: answered OK with no \
             limit (map its keys with `ctxbudget envoy set`; \
             ctxbudget_envoy_descriptors_total{{outcome=\"unmapped\"}} counts them)"
        );
    }
}
