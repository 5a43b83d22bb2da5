//! Budget state: one [`Store`] trait, two implementations with the same
//! semantics — [`memory::MemoryStore`] (the default: nothing to install) and
//! [`redis::RedisStore`] (shared by every replica, changed only by the atomic Lua
//! scripts in `lua/`); on a Redis Cluster, [`cluster::ClusterStore`] wraps
//! the Redis store and leases the global level in chunks. The conformance
//! suite in `tests/` runs one set of behaviours against all three.

pub mod alerts;
pub mod cluster;
pub mod config_repo;
pub mod keys;
pub mod line;
pub mod memory;
pub mod redis;
pub mod scripts;

use crate::domain::budget::ledger::{LedgerRow, Period};
use crate::domain::mix::EstimatorSample;
use crate::domain::{LevelPlan, Readings, ReservationId, ReservePlan, SessionId, TenantId, UserId};
use std::future::Future;
use std::sync::Arc;

pub use crate::domain::budget::{
    ChargePlan, ChargeReply, DeniedChecks, Reclaimed, RenewReply, ReserveReply, Retention,
    SettleReply, Settled, Usage,
};
pub use crate::domain::layout::EXACT_LEASES;
pub use alerts::{AlertBacklog, AlertDone, QueuedAlert};
pub use line::LineStore;

/// Which reservation to settle, and the levels it touched (every level of the
/// reservation, limited or not, so a lease is released wherever it is held).
#[derive(Clone, Copy, Debug)]
pub struct Settlement<'a> {
    /// The reservation.
    pub id: &'a ReservationId,
    /// Global, tenant and (with a user, a session) user and session levels,
    /// with their current limits.
    pub levels: &'a [LevelPlan],
}

/// [`Store::reserve_first`] as one [`Store::reserve`] call per plan.
pub async fn one_by_one<S: Store + ?Sized>(
    store: &S,
    plans: &[ReservePlan],
) -> Result<Vec<ReserveReply>, StoreError> {
    let mut replies = Vec::with_capacity(plans.len());
    for plan in plans {
        let reply = store.reserve(plan).await?;
        let allowed = matches!(reply, ReserveReply::Allowed { .. });
        replies.push(reply);
        if allowed {
            break;
        }
    }
    Ok(replies)
}

/// Whose levels: a tenant, and its user and session when they apply.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The tenant.
    pub tenant: &'a TenantId,
    /// The user, if any.
    pub user: Option<&'a UserId>,
    /// The session (of the user, or of the tenant's calls naming none), if any.
    pub session: Option<&'a SessionId>,
}

impl<'a> Scope<'a> {
    /// A tenant's levels, and its user's when `user` names one: no session.
    pub fn new(tenant: &'a TenantId, user: Option<&'a UserId>) -> Self {
        Scope {
            tenant,
            user,
            session: None,
        }
    }

    /// The tenant, user and session a reservation's levels belong to.
    pub fn of(id: &'a ReservationId) -> Self {
        Scope {
            tenant: &id.tenant,
            user: id.user.as_ref(),
            session: id.session.as_ref(),
        }
    }
}

/// The error underneath a [`StoreError`] (a Redis error, an I/O error), shared
/// so a `StoreError` stays `Clone`.
pub type StoreCause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What a [`StoreError`] says, and the error underneath it when there is one.
#[derive(Clone, Debug)]
pub struct Detail {
    text: String,
    cause: Option<StoreCause>,
}

impl Detail {
    /// A detail with no error underneath.
    pub fn new(text: impl Into<String>) -> Self {
        Detail {
            text: text.into(),
            cause: None,
        }
    }

    /// A detail caused by `cause`, which `StoreError::source` then returns.
    pub fn caused_by(
        text: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Detail {
            text: text.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// The words.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The error underneath, if any.
    pub fn cause(&self) -> Option<&StoreCause> {
        self.cause.as_ref()
    }
}

impl From<String> for Detail {
    fn from(text: String) -> Self {
        Detail::new(text)
    }
}

impl From<&str> for Detail {
    fn from(text: &str) -> Self {
        Detail::new(text)
    }
}

impl std::fmt::Display for Detail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// The store could not answer. Every variant says whether a retry may help,
/// and carries the error underneath it (see [`std::error::Error::source`]).
#[derive(Debug, Clone)]
pub enum StoreError {
    /// Unreachable, loading, out of memory, refusing writes: the call was not
    /// applied; retry or fail over.
    Unavailable(Detail),
    /// The call was sent, or may have been, but no answer came (its deadline
    /// passed, the connection dropped): retry or fail over, knowing it may
    /// have been applied.
    Unanswered(Detail),
    /// The store answered something the service does not understand: a bug or
    /// foreign data under the key prefix. Retrying will not help.
    Protocol(Detail),
    /// The store's settings are wrong (a malformed URL, unreadable or
    /// mismatched TLS files): fix them; retrying will not help.
    Settings(Detail),
}

impl StoreError {
    /// True when a retry may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Unanswered(_))
    }

    /// What the error says, and its cause.
    pub fn detail(&self) -> &Detail {
        match self {
            StoreError::Unavailable(d)
            | StoreError::Unanswered(d)
            | StoreError::Protocol(d)
            | StoreError::Settings(d) => d,
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(d) | StoreError::Unanswered(d) => {
                write!(f, "budget store unavailable: {d}")
            }
            StoreError::Protocol(d) => write!(f, "budget store answered unexpectedly: {d}"),
            StoreError::Settings(d) => write!(f, "budget store settings: {d}"),
        }
    }
}

/// By hand rather than `thiserror`: the source is the cause inside the
/// [`Detail`], not the detail itself.
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let cause = self.detail().cause()?;
        Some(cause.as_ref())
    }
}

/// The estimator's samples, which Commit writes and the estimator reads:
/// the counted prompts' and the completions'.
pub trait SampleStore: Send + Sync + 'static {
    /// The estimator samples of each key, newest first (the settle scripts
    /// keep [`crate::domain::budget::Retention`]'s `samples` of them).
    fn estimator_samples(
        &self,
        keys: &[String],
    ) -> impl Future<Output = Result<Vec<Vec<EstimatorSample>>, StoreError>> + Send;

    /// The completions' output tokens under each (estimator key, tier),
    /// newest first (settle keeps [`Usage::output_kept`] of them).
    fn output_samples(
        &self,
        pairs: &[(String, String)],
    ) -> impl Future<Output = Result<Vec<Vec<u64>>, StoreError>> + Send;
}

/// The usage ledger, which reserve and settle write in the same atomic step
/// and the usage reports and reconciliation read.
pub trait LedgerStore: Send + Sync + 'static {
    /// `tenant`'s usage-ledger rows of each period, by group then user.
    fn ledger(
        &self,
        tenant: &TenantId,
        periods: &[Period],
    ) -> impl Future<Output = Result<Vec<Vec<LedgerRow>>, StoreError>> + Send;

    /// Every tenant with hourly (`hourly`) or daily ledger rows, and which
    /// periods, sorted (reconciliation, the console's tenant list).
    fn ledger_keys(
        &self,
        hourly: bool,
    ) -> impl Future<Output = Result<Vec<(TenantId, Period)>, StoreError>> + Send;
}

/// The threshold alerts' queues, which reserve, settle and charge fill in
/// the same atomic step and the alert senders drain. A store that keeps no
/// alerts answers with none.
pub trait AlertStore: Send + Sync + 'static {
    /// Claims up to `max` queued alerts due now in all (queue by queue, in
    /// the order of their keys), each for `claim_ms` (no other replica takes
    /// them meanwhile; a claim not finished lapses and the alert is due
    /// again). None on a store that keeps no alerts.
    fn claim_alerts(
        &self,
        max: usize,
        claim_ms: u64,
    ) -> impl Future<Output = Result<Vec<QueuedAlert>, StoreError>> + Send {
        let _ = (max, claim_ms);
        async { Ok(Vec::new()) }
    }

    /// What became of a claimed alert.
    fn finish_alert(
        &self,
        alert: &QueuedAlert,
        done: AlertDone,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (alert, done);
        async { Ok(()) }
    }

    /// Finds queues holding alerts that the index lacks and indexes them (on a
    /// Redis Cluster, a replica that died between a crossing and indexing its
    /// queue leaves one so); how many. Nothing to do elsewhere.
    fn reindex_alerts(&self) -> impl Future<Output = Result<usize, StoreError>> + Send {
        async { Ok(0) }
    }

    /// Every queued alert and the counts dropped (`ctxbudget alerts list`).
    fn alert_backlog(&self) -> impl Future<Output = Result<AlertBacklog, StoreError>> + Send {
        async { Ok(AlertBacklog::default()) }
    }

    /// Keeps `line` (an alert sent or dropped, as JSON) first among the last
    /// `keep`.
    fn note_alert(
        &self,
        line: String,
        keep: usize,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (line, keep);
        async { Ok(()) }
    }

    /// The last `n` alerts sent or dropped, newest first.
    fn recent_alerts(
        &self,
        n: usize,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send {
        let _ = n;
        async { Ok(Vec::new()) }
    }
}

/// Budget state with atomic reserve and settle operations; the estimator's
/// samples, the ledger and the alerts it writes with them are read through
/// traits of their own, and the lines of calls waiting for a shared level
/// are [`LineStore`]'s.
pub trait Store: SampleStore + LedgerStore + AlertStore + LineStore {
    /// The store's time (µs since the epoch) as near as the service can
    /// tell before a call: where a plan's calendar windows' boundaries fall.
    /// Redis scripts read Redis `TIME` and correct for a boundary crossed
    /// since (see [`crate::domain::window::Span`]).
    fn now_us(&self) -> i64 {
        crate::domain::Clock::now_us(&crate::domain::SystemClock)
    }

    /// Takes the plan's cost at every level, or nothing.
    fn reserve(
        &self,
        plan: &ReservePlan,
    ) -> impl Future<Output = Result<ReserveReply, StoreError>> + Send;

    /// Reserves the first of `plans` (fallback candidates, in order) whose
    /// limits all have room: each plan decided as [`Store::reserve`] decides
    /// it. The replies of the plans tried, every one denied but the last,
    /// which may be allowed. Here one call per plan; the Redis store makes
    /// them one script call.
    fn reserve_first(
        &self,
        plans: &[ReservePlan],
    ) -> impl Future<Output = Result<Vec<ReserveReply>, StoreError>> + Send {
        one_by_one(self, plans)
    }

    /// Settles a reservation with the usage the upstream reported (its prompt
    /// is an estimator sample when the service counted the prompt).
    fn commit(
        &self,
        settlement: Settlement<'_>,
        usage: Usage,
    ) -> impl Future<Output = Result<SettleReply, StoreError>> + Send;

    /// Returns a reservation's request and tokens.
    fn refund(
        &self,
        settlement: Settlement<'_>,
    ) -> impl Future<Output = Result<SettleReply, StoreError>> + Send;

    /// Extends a live reservation's lease to `ttl_ms` from now.
    fn renew(
        &self,
        settlement: Settlement<'_>,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<RenewReply, StoreError>> + Send;

    /// Reads the levels of `scope` without changing anything.
    /// With `exact`, a level of at most [`EXACT_LEASES`] leases is read whole
    /// for its real earliest lease expiry (GetStatus); otherwise that expiry
    /// may be a lower bound (cheap: refusals read limits this way).
    fn status(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> impl Future<Output = Result<Readings, StoreError>> + Send;

    /// Takes requests or tokens at every level with no reservation behind
    /// them (enforced: all or nothing, and a check needs room).
    fn charge(
        &self,
        plan: &ChargePlan,
    ) -> impl Future<Output = Result<ChargeReply, StoreError>> + Send;

    /// The same backend with every key under `<prefix>shadow:`: where quotas in
    /// shadow keep their own buckets and leases, apart from the enforced ones.
    fn shadow(&self) -> Self
    where
        Self: Sized;

    /// Checks the store answers on every connection it holds, reconnecting
    /// the ones that broke, within a bounded time: the circuit breaker's probe
    /// before real calls may reach a recovering store.
    fn probe(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One line for the startup log: which store, where.
    fn describe(&self) -> String;
}
