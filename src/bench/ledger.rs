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
            Level::User | Level::Session => Scope::User(item.tenant, item.user),
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
    /// The largest reservation asked for (prompt + max output): one
    /// request's worth.
    largest: u64,
    /// Token-bucket checks made while the run went on, and those in debt
    /// beyond one request's worth.
    samples: (u64, u64),
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
    /// Some level holds the learned output: a call may use more than it
    /// reserved, so token buckets may owe up to one request's worth (what a
    /// Commit's debt honestly is) before it counts as overspent.
    learned: bool,
}

impl Ledger {
    /// A ledger for `tiers` (the workload's tier names, in order) under `limits`.
    pub fn new(limits: &Limits, tiers: &[String]) -> Self {
        let tiers: Vec<Vec<LevelPlan>> = tiers
            .iter()
            .map(|t| {
                let scope = plan::Scope {
                    tier: limits.tier(t).map(|t| t.as_ref()),
                    group: limits.group_of(super::workload::BENCH_MODEL),
                    has_user: true,
                    has_session: false,
                    now_us: crate::domain::Clock::now_us(&crate::domain::SystemClock),
                };
                plan::levels(limits, scope, false)
            })
            .collect();
        let learned = tiers
            .iter()
            .any(|levels| levels.iter().any(|l| l.overrun.is_some()));
        Ledger {
            book: Mutex::new(Book::default()),
            tiers,
            requests_only: false,
            learned,
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

    /// An allowed reservation of `item`, `held` output tokens reserved.
    pub fn granted(&self, item: &Item, held: u64) {
        {
            let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
            book.largest = book.largest.max(item.prompt + item.max_output);
        }
        self.apply(item, 1, (item.prompt + held) as i64, 1);
    }

    /// A commit: the surplus went back (or the overage was charged: a
    /// learned output) and the slot is free.
    pub fn committed(&self, item: &Item, held: u64) {
        let reserved = (item.prompt + held) as i64;
        let used = (item.prompt + item.completion) as i64;
        self.apply(item, 0, used - reserved, -1);
    }

    /// A refund: request and tokens went back and the slot is free (with
    /// Envoy's API nothing goes back: the request path took the request).
    pub fn refunded(&self, item: &Item, held: u64) {
        if self.requests_only {
            return;
        }
        self.apply(item, -1, -((item.prompt + held) as i64), -1);
    }

    /// What a token bucket may owe beyond its allowance before it counts as
    /// overspent: one request's worth with a learned output, else nothing.
    fn slack(&self, book: &Book, dimension: Dimension) -> f64 {
        match self.learned && dimension.is_tokens() {
            true => book.largest as f64,
            false => 0.0,
        }
    }

    /// Checks every token bucket `elapsed` into the run, as [`Self::check`]
    /// does at its end: the run's share of windows in debt beyond one
    /// request's worth is [`Self::debt_windows`].
    pub fn sample(&self, elapsed: Duration) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let (mut checked, mut over) = (0, 0);
        for (b, &(granted, limit)) in book.granted.iter().filter(|(b, _)| b.dimension.is_tokens()) {
            let allowed = allowance(limit, elapsed, b.period_secs);
            checked += 1;
            if granted as f64 > allowed + book.largest as f64 + 1e-6 {
                over += 1;
            }
        }
        book.samples.0 += checked;
        book.samples.1 += over;
    }

    /// Token-bucket checks made during the run (every half second, each
    /// bucket used) and those in debt beyond one request's worth.
    pub fn debt_windows(&self) -> (u64, u64) {
        self.book.lock().unwrap_or_else(|p| p.into_inner()).samples
    }

    /// Buckets that granted more than `limit + limit × elapsed / period`
    /// (token buckets: plus one request's worth with a learned output), and
    /// scopes that held more slots than their limit. Empty means no overspend.
    pub fn check(&self, elapsed: Duration) -> (usize, Vec<Offender>) {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let mut offenders = Vec::new();
        for (b, &(granted, limit)) in &book.granted {
            let allowed = allowance(limit, elapsed, b.period_secs) + self.slack(&book, b.dimension);
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

/// What a bucket of `limit` per `period_secs` allows over `elapsed`: its
/// burst and its refill.
fn allowance(limit: u64, elapsed: Duration, period_secs: u64) -> f64 {
    limit as f64 + limit as f64 * elapsed.as_secs_f64() / period_secs as f64
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
            prompt_as_text: false,
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
            l.granted(&item(1, 1), 10);
            l.committed(&item(1, 1), 10);
        }
        l.granted(&item(1, 2), 10);
        l.refunded(&item(1, 2), 10);
        let (checked, offenders) = l.check(Duration::from_secs(1));
        assert_eq!(checked, 4, "two request buckets and two concurrency scopes");
        assert!(offenders.is_empty(), "{offenders:?}");
    }

    #[test]
    fn overspend_and_excess_concurrency_are_caught() {
        let l = ledger();
        for _ in 0..4 {
            l.granted(&item(7, 7), 10);
        }
        let (_, offenders) = l.check(Duration::from_secs(1));
        let names: Vec<_> = offenders.iter().map(|o| o.bucket.as_str()).collect();
        assert_eq!(
            names,
            ["user t7/u7 concurrency", "user t7/u7 requests per 3600s"]
        );
        assert_eq!(offenders[1].granted, 4.0);
    }

    #[test]
    fn a_learned_output_may_owe_one_request_and_no_more() {
        let toml = r#"
[global]
[tiers.t]
max_context_tokens = 1000
default_max_output_tokens = 10
user = { tokens = [{ limit = 1000, period = "1h" }], output_reservation = "learned" }
"#;
        let limits = FileConfig::parse(toml, "t").unwrap().limits().unwrap();
        let l = Ledger::new(&limits, &["t".to_string()]);
        // Ten calls of 90 + 10 reserved 90 + 2 each and used 95: 950 of 1000.
        let mut big = item(1, 1);
        big.completion = 5;
        for _ in 0..10 {
            l.granted(&big, 2);
            l.committed(&big, 2);
        }
        // One more asked for 60 output tokens and wrote them all: 1100 used,
        // 100 of debt, within one request's worth (90 + 60).
        big.max_output = 60;
        big.completion = 60;
        l.granted(&big, 2);
        l.committed(&big, 2);
        l.sample(Duration::ZERO);
        assert!(l.check(Duration::ZERO).1.is_empty());
        assert_eq!(l.debt_windows(), (1, 0));
        // Three more: 550 of debt, beyond one request's worth.
        for _ in 0..3 {
            l.granted(&big, 2);
            l.committed(&big, 2);
        }
        l.sample(Duration::ZERO);
        assert_eq!(l.debt_windows(), (2, 1));
        let (_, offenders) = l.check(Duration::ZERO);
        assert_eq!(offenders[0].granted, 1550.0);
    }
}
