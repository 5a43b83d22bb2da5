//! What the service does with a request's bytes before any store call —
//! decode, validate, plan against the built-in tiers, build the store keys —
//! as one function without a server. The fuzz target (`fuzz/`) and the
//! hostile-input tests drive it: whatever the bytes, it returns (an error is a
//! message for INVALID_ARGUMENT), never panics, and allocates no more than the
//! input's size calls for.

use super::convert;
use crate::domain::plan::{self, LeasePolicy, Prepared, Terms};
use crate::domain::{Level, Limits, Priorities, PromptCount, PromptInput, ReservationId};
use crate::pb;
use crate::store::keys::{DEFAULT_PREFIX, Keys, lease_field};
use prost::Message;
use std::sync::OnceLock;

/// What the bytes were taken for, from the first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rpc {
    /// `CheckAndReserveRequest`.
    CheckAndReserve,
    /// `CommitRequest`.
    Commit,
    /// `RefundRequest`.
    Refund,
    /// `RenewLeaseRequest`.
    RenewLease,
    /// `GetStatusRequest`.
    GetStatus,
}

/// Validates `data`: its first byte picks the RPC, the rest is that RPC's
/// request message. `Ok` with the RPC when the service would go on to the
/// store, `Err` with the INVALID_ARGUMENT message (or the decision to refuse)
/// otherwise.
pub fn check_bytes(data: &[u8]) -> Result<Rpc, String> {
    let Some((&selector, body)) = data.split_first() else {
        return Err("empty input".into());
    };
    let rpc = match selector % 5 {
        0 => Rpc::CheckAndReserve,
        1 => Rpc::Commit,
        2 => Rpc::Refund,
        3 => Rpc::RenewLease,
        _ => Rpc::GetStatus,
    };
    let decode_error = |e: prost::DecodeError| e.to_string();
    match rpc {
        Rpc::CheckAndReserve => {
            let request = pb::CheckAndReserveRequest::decode(body).map_err(decode_error)?;
            check_reserve(request)?;
        }
        Rpc::Commit => {
            let r = pb::CommitRequest::decode(body).map_err(decode_error)?;
            let r = convert::commit_request(r).map_err(|e| e.to_string())?;
            check_reservation_id(&r.id);
        }
        Rpc::Refund => {
            let r = pb::RefundRequest::decode(body).map_err(decode_error)?;
            check_reservation_id(&parse_id(&r.reservation_id)?);
        }
        Rpc::RenewLease => {
            let r = pb::RenewLeaseRequest::decode(body).map_err(decode_error)?;
            check_reservation_id(&parse_id(&r.reservation_id)?);
        }
        Rpc::GetStatus => {
            let r = pb::GetStatusRequest::decode(body).map_err(decode_error)?;
            let r = convert::status_request(r).map_err(|e| e.to_string())?;
            let keys = keys();
            let who = crate::store::Scope {
                tenant: &r.tenant,
                user: r.user.as_ref(),
                session: r.session.as_ref(),
            };
            let session = who.session.map(|_| Level::Session);
            for level in [Level::Tenant, Level::User].into_iter().chain(session) {
                check_key(&keys.level(level, who));
            }
        }
    }
    Ok(rpc)
}

fn check_reserve(request: pb::CheckAndReserveRequest) -> Result<(), String> {
    let request = convert::reserve_request(request).map_err(|e| e.to_string())?;
    let keys = keys();
    if let Some(key) = &request.idempotency_key {
        check_key(&keys.idempotency(&request.tenant, key));
    }
    // Counting text is the estimator's (bounded by the message size); a
    // caller's count goes straight to the plan.
    let PromptInput::Tokens(prompt) = request.prompt else {
        return Ok(());
    };
    let limits = limits();
    let tier = limits
        .resolve_known(&request.tier, request.tenant.as_str())
        .map_err(|e| e.to_string())?;
    let terms = Terms {
        limits,
        tier: &tier,
        leases: LeasePolicy {
            default_ttl_ms: 120_000,
            max_ttl_ms: 600_000,
        },
        priorities: Priorities::default(),
        now_us: 0,
    };
    let count = PromptCount::given(prompt);
    match plan::prepare(&request, &request.model, &count, &terms).map_err(|e| e.to_string())? {
        Prepared::Plan(plan) => {
            for level in &plan.levels {
                check_key(&keys.plan_level(level, crate::store::Scope::of(&plan.id)));
            }
            check_key(&keys.record(&plan.id));
            let again = ReservationId::parse(&plan.id.to_string())
                .expect("an issued reservation id parses");
            assert_eq!(again, plan.id, "reservation ids round-trip");
            Ok(())
        }
        Prepared::Refused { denial, .. } => Err(denial.detail),
    }
}

fn parse_id(id: &str) -> Result<ReservationId, String> {
    ReservationId::parse(id).map_err(|e| e.to_string())
}

/// A parsed id's invariants: its record key, its lease field, and its
/// printed form parsing back to it.
fn check_reservation_id(id: &ReservationId) {
    check_key(&keys().record(id));
    assert!(lease_field(id).starts_with('#'));
    assert_eq!(
        ReservationId::parse(&id.to_string()).as_ref(),
        Ok(id),
        "a parsed id prints back to an equal id"
    );
}

/// Key invariants: under the prefix, and (for a tenant's keys) exactly one
/// hash tag, so every id stays within its tenant's Redis Cluster slot.
fn check_key(key: &str) {
    assert!(key.starts_with(DEFAULT_PREFIX), "{key}");
    let opens = key.matches('{').count();
    let closes = key.matches('}').count();
    assert!(opens <= 1 && opens == closes, "one hash tag at most: {key}");
    assert!(
        key.bytes().all(|b| b.is_ascii_graphic()),
        "keys are printable ASCII: {key:?}"
    );
}

fn keys() -> Keys {
    Keys::new(DEFAULT_PREFIX).expect("the default prefix is valid")
}

fn limits() -> &'static Limits {
    static LIMITS: OnceLock<Limits> = OnceLock::new();
    LIMITS.get_or_init(|| {
        crate::config::FileConfig::built_in()
            .limits()
            .expect("the built-in limits are valid")
    })
}
