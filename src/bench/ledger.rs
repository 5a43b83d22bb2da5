//! The overspend check of every benchmark run. The bench keeps its own account of
//! what the service granted per bucket — reservations allowed, minus refunds and
//! returned surpluses — and of the reservations it held at once per scope. At the
//! end, each bucket's grants must fit its burst plus refill over the run, and no
//! scope may ever have held more slots than its concurrency limit. A fast wrong
//! answer is not a result.

use super::workload::Item;
use crate::domain::plan::{self, LevelPlan};
use crate::domain::{Dimension, Level, Limits};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Scope {
    Global,
    Tenant(u32),
    User(u32, u32),
}

impl Scope {
    fn of(level: Level, item: &Item) -> Scope {
        match level {
            Level::Global => Scope::Global,
            Level::Tenant => Scope::Tenant(item.tenant),
            Level::User => Scope::User(item.tenant, item.user),
        }
    }

    fn describe(self) -> String {
        match self {
            Scope::Global => "global".into(),
            Scope::Tenant(t) => format!("tenant t{t}"),
            Scope::User(t, u) => format!("user t{t}/u{u}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Bucket {
    scope: Scope,
    dimension: Dimension,
    period_secs: u64,
}

#[derive(Default)]
struct Book {
    granted: HashMap<Bucket, (i64, u64)>,
    held: HashMap<Scope, (i64, i64, u64)>,
}

/// A bucket or concurrency limit the service let through more than it allows.
#[derive(Clone, Debug, Serialize)]
pub struct Offender {
    /// Which scope, dimension and period.
    pub bucket: String,
    /// The configured limit.
    pub limit: u64,
    /// What was granted (or the most slots held at once).
    pub granted: f64,
    /// What the limit allows over the run.
    pub allowed: f64,
}

/// Grants per bucket over one run.
pub struct Ledger {
    book: Mutex<Book>,
    tiers: Vec<Vec<LevelPlan>>,
    /// Only request limits are checked (Envoy's API: tokens are charged
    /// after the fact, into debt, and concurrency is not limited).
    requests_only: bool,
}

impl Ledger {
    /// A ledger for `tiers` (the workload's tier names, in order) under `limits`.
    pub fn new(limits: &Limits, tiers: &[String]) -> Self {
        let tiers = tiers
            .iter()
            .map(|t| {
                let scope = plan::Scope {
                    tier: limits.tier(t).map(|t| t.as_ref()),
                    group: limits.group_of(super::target::BENCH_MODEL),
                    has_user: true,
                    now_us: crate::domain::Clock::now_us(&crate::domain::SystemClock),
                };
                plan::levels(limits, scope, false)
            })
            .collect();
        Ledger {
            book: Mutex::new(Book::default()),
            tiers,
            requests_only: false,
        }
    }

    /// The ledger checking request limits alone: what Envoy's API guarantees
    /// (tokens are charged once spent, so in-flight calls can overspend them
    /// by their usage; concurrency is not limited).
    pub fn requests_only(mut self) -> Self {
        self.requests_only = true;
        self
    }

    fn apply(&self, item: &Item, requests: i64, tokens: i64, slots: i64) {
        let (tokens, slots) = match self.requests_only {
            true => (0, 0),
            false => (tokens, slots),
        };
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        for lp in &self.tiers[item.tier] {
            let scope = Scope::of(lp.level, item);
            for b in &lp.buckets {
                let delta = match b.dimension {
                    Dimension::Requests => requests,
                    _ => tokens,
                };
                if delta != 0 {
                    let key = Bucket {
                        scope,
                        dimension: b.dimension,
                        period_secs: b.period_secs,
                    };
                    let entry = book.granted.entry(key).or_insert((0, b.limit));
                    entry.0 += delta;
                }
            }
            if let (Some(limit), true) = (lp.concurrency, slots != 0) {
                let entry = book.held.entry(scope).or_insert((0, 0, limit));
                entry.0 += slots;
                entry.1 = entry.1.max(entry.0);
            }
        }
    }

    /// An allowed reservation of `item`.
    pub fn granted(&self, item: &Item) {
        self.apply(item, 1, (item.prompt + item.max_output) as i64, 1);
    }

    /// A commit: the surplus went back and the slot is free.
    pub fn committed(&self, item: &Item) {
        let reserved = (item.prompt + item.max_output) as i64;
        let used = (item.prompt + item.completion) as i64;
        self.apply(item, 0, (used - reserved).min(0), -1);
    }

    /// A refund: request and tokens went back and the slot is free (with
    /// Envoy's API nothing goes back: the request path took the request).
    pub fn refunded(&self, item: &Item) {
        if self.requests_only {
            return;
        }
        self.apply(item, -1, -((item.prompt + item.max_output) as i64), -1);
    }

    /// Buckets that granted more than `limit + limit × elapsed / period`, and
    /// scopes that held more slots than their limit. Empty means no overspend.
    pub fn check(&self, elapsed: Duration) -> (usize, Vec<Offender>) {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let mut offenders = Vec::new();
        for (b, &(granted, limit)) in &book.granted {
            let allowed =
                limit as f64 + limit as f64 * elapsed.as_secs_f64() / b.period_secs as f64;
            if granted as f64 > allowed + 1e-6 {
                offenders.push(Offender {
                    bucket: format!(
                        "{} {} per {}s",
                        b.scope.describe(),
                        b.dimension.as_str(),
                        b.period_secs
                    ),
                    limit,
                    granted: granted as f64,
                    allowed,
                });
            }
        }
        for (scope, &(_, max, limit)) in &book.held {
            if max > limit as i64 {
                offenders.push(Offender {
                    bucket: format!("{} concurrency", scope.describe()),
                    limit,
                    granted: max as f64,
                    allowed: limit as f64,
                });
            }
        }
        offenders.sort_by(|a, b| a.bucket.cmp(&b.bucket));
        (book.granted.len() + book.held.len(), offenders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn item(tenant: u32, user: u32) -> Item {
        Item {
            tenant,
            user,
            tier: 0,
            prompt: 90,
            max_output: 10,
            completion: 5,
            upstream: Duration::ZERO,
            refund: false,
        }
    }

    fn ledger() -> Ledger {
        let toml = r#"
[global]
[tiers.t]
max_context_tokens = 1000
default_max_output_tokens = 10
user = { requests = [{ limit = 3, period = "1h" }], concurrency = 2 }
"#;
        let limits = FileConfig::parse(toml, "t").unwrap().limits().unwrap();
        Ledger::new(&limits, &["t".to_string()])
    }

    #[test]
    fn grants_within_the_limit_pass() {
        let l = ledger();
        for _ in 0..3 {
            l.granted(&item(1, 1));
            l.committed(&item(1, 1));
        }
        l.granted(&item(1, 2));
        l.refunded(&item(1, 2));
        let (checked, offenders) = l.check(Duration::from_secs(1));
        assert_eq!(checked, 4, "two request buckets and two concurrency scopes");
        assert!(offenders.is_empty(), "{offenders:?}");
    }

    #[test]
    fn overspend_and_excess_concurrency_are_caught() {
        let l = ledger();
        for _ in 0..4 {
            l.granted(&item(7, 7));
        }
        let (_, offenders) = l.check(Duration::from_secs(1));
        let names: Vec<_> = offenders.iter().map(|o| o.bucket.as_str()).collect();
        assert_eq!(
            names,
            ["user t7/u7 concurrency", "user t7/u7 requests per 3600s"]
        );
        assert_eq!(offenders[1].granted, 4.0);
    }
}
