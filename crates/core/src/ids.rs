//! Identifiers callers send: tenant and user ids, idempotency keys, and the
//! reservation ids the service hands out. Validation lives here so that nothing
//! malformed reaches a store key.

pub(crate) use super::digest::Fnv;
use super::tier::is_tier_name;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::fmt;

/// Longest tenant id, user id or idempotency key, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Bytes of randomness in a reservation id.
pub const NONCE_BYTES: usize = 16;
/// Longest reservation id string the service ever issues.
const MAX_RESERVATION_ID_CHARS: usize = 1024;
const RESERVATION_PREFIX: &str = "rsv_";
const RESERVATION_VERSION: u8 = 1;
/// The version of ids that also carry a model group (ids without one keep
/// version 1, so replicas of the previous release still read them).
const RESERVATION_VERSION_GROUP: u8 = 2;
/// The version of ids that carry a session: the group (empty: none), then the
/// session id.
const RESERVATION_VERSION_SESSION: u8 = 3;

/// A request field failed validation; the message says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidInput {
    /// The request field at fault.
    pub field: &'static str,
    /// What is wrong and what is accepted.
    pub message: String,
}

impl InvalidInput {
    /// An error about `field`.
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        InvalidInput {
            field,
            message: message.into(),
        }
    }
}

/// Checks an id: 1-256 bytes of UTF-8 (guaranteed by `&str`), no control characters.
fn check_id(field: &'static str, value: &str) -> Result<(), InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::new(field, "is required (1-256 bytes)"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(InvalidInput::new(
            field,
            format!(
                "is {} bytes; at most {MAX_ID_BYTES} are allowed",
                value.len()
            ),
        ));
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(InvalidInput::new(
            field,
            format!("contains the control character {c:?}; control characters are not allowed"),
        ));
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $field:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates `value` as this kind of id.
            pub fn parse(value: &str) -> Result<Self, InvalidInput> {
                check_id($field, value)?;
                Ok($name(value.to_owned()))
            }

            /// The id as the caller sent it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A customer's id: arbitrary UTF-8, 1-256 bytes, no control characters.
    TenantId,
    "tenant_id"
);
id_type!(
    /// A user's id within a tenant: same rules as [`TenantId`].
    UserId,
    "user_id"
);
id_type!(
    /// One session of a user (an agent run, a trace, a conversation): same
    /// rules as [`TenantId`]. The same id under two users is two sessions.
    SessionId,
    "session_id"
);
id_type!(
    /// A caller's key that makes a retried CheckAndReserve return the original
    /// reservation. Scoped per tenant.
    IdempotencyKey,
    "idempotency_key"
);

/// A reservation: who made it (tenant, user, tier) and 128 random bits.
///
/// The string form carries the tenant, user and tier so that Commit, Refund and
/// RenewLease — which send only the id — can find the tenant's keys and the
/// tier's limits without a lookup. The random part makes ids unguessable, and
/// the stored record is keyed by it and checked against the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationId {
    /// The tenant whose keys hold the reservation.
    pub tenant: TenantId,
    /// The user, when the reservation applied user-level limits.
    pub user: Option<UserId>,
    /// The session, when the reservation applied session-level limits.
    pub session: Option<SessionId>,
    /// The tier whose limits applied.
    pub tier: String,
    /// The adaptive estimator key the prompt was counted under; empty when the
    /// caller sent its own count (nothing to learn from).
    pub estimator: String,
    /// The model group whose limits applied; empty when the model has none.
    pub group: String,
    /// Made by this replica's local store while the shared store was
    /// unavailable (degraded mode): settled there too.
    pub local: bool,
    /// 128 random bits.
    pub nonce: [u8; NONCE_BYTES],
}

impl ReservationId {
    /// A fresh reservation id with a random nonce from a CSPRNG.
    pub fn generate(
        tenant: TenantId,
        user: Option<UserId>,
        tier: String,
        estimator: String,
    ) -> Self {
        let nonce = rand::random::<[u8; NONCE_BYTES]>();
        ReservationId {
            tenant,
            user,
            session: None,
            tier,
            estimator,
            group: String::new(),
            local: false,
            nonce,
        }
    }

    /// The same id for a reservation under model group `group`.
    pub fn with_group(self, group: String) -> Self {
        ReservationId { group, ..self }
    }

    /// The same id for a reservation of session `session`.
    pub fn with_session(self, session: Option<SessionId>) -> Self {
        ReservationId { session, ..self }
    }

    /// The nonce in base64url: 22 characters, used in store keys.
    pub fn nonce_b64(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.nonce)
    }

    /// A nonce string as produced by [`Self::nonce_b64`] back to bytes.
    pub fn with_nonce_b64(&self, nonce: &str) -> Option<Self> {
        let bytes = URL_SAFE_NO_PAD.decode(nonce).ok()?;
        Some(ReservationId {
            nonce: bytes.try_into().ok()?,
            ..self.clone()
        })
    }

    /// A 64-bit digest of (user, tier, estimator key, model group, session):
    /// stored with the reservation and checked on settlement, so an id whose
    /// user, tier, estimator key, group or session was edited finds nothing.
    pub fn owner_tag(&self) -> u64 {
        let mut h = Fnv::new();
        h.write(self.user.as_ref().map_or("", |u| u.as_str()).as_bytes());
        h.write(&[0xff]);
        h.write(self.tier.as_bytes());
        h.write(&[0xff]);
        h.write(self.estimator.as_bytes());
        if !self.group.is_empty() {
            h.write(&[0xff]);
            h.write(self.group.as_bytes());
        }
        if let Some(session) = &self.session {
            h.write(&[0xfe]);
            h.write(session.as_str().as_bytes());
        }
        h.finish()
    }

    /// Parses an id issued by [`fmt::Display`]; anything else is `INVALID_ARGUMENT`.
    pub fn parse(value: &str) -> Result<Self, InvalidInput> {
        let bad = || {
            InvalidInput::new(
                "reservation_id",
                "is not a reservation id issued by ctxbudget (expected the reservation_id \
                 returned by CheckAndReserve)",
            )
        };
        if value.is_empty() {
            return Err(InvalidInput::new("reservation_id", "is required"));
        }
        if value.len() > MAX_RESERVATION_ID_CHARS {
            return Err(bad());
        }
        let body = value.strip_prefix(RESERVATION_PREFIX).ok_or_else(bad)?;
        let blob = URL_SAFE_NO_PAD.decode(body).map_err(|_| bad())?;
        let mut r = Reader(&blob);
        let version = r.u8().ok_or_else(bad)?;
        if !(RESERVATION_VERSION..=RESERVATION_VERSION_SESSION).contains(&version) {
            return Err(bad());
        }
        let local = match r.u8().ok_or_else(bad)? {
            0 => false,
            1 => true,
            _ => return Err(bad()),
        };
        let tenant = r.string().ok_or_else(bad)?;
        let user = r.string().ok_or_else(bad)?;
        let tier = r.string().ok_or_else(bad)?;
        let estimator = r.string().ok_or_else(bad)?;
        let (group, session) = r.group_and_session(version).ok_or_else(bad)?;
        let nonce: [u8; NONCE_BYTES] = r.rest().try_into().map_err(|_| bad())?;
        let tenant = TenantId::parse(tenant).map_err(|_| bad())?;
        let user = match user {
            "" => None,
            u => Some(UserId::parse(u).map_err(|_| bad())?),
        };
        if !is_tier_name(tier) || estimator.len() > MAX_ID_BYTES {
            return Err(bad());
        }
        Ok(ReservationId {
            tenant,
            user,
            session,
            tier: tier.to_owned(),
            estimator: estimator.to_owned(),
            group: group.to_owned(),
            local,
            nonce,
        })
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = self.user.as_ref().map_or("", |u| u.as_str());
        let session = self.session.as_ref().map(SessionId::as_str);
        let mut blob = Vec::with_capacity(
            30 + self.tenant.0.len()
                + user.len()
                + self.tier.len()
                + self.estimator.len()
                + self.group.len()
                + session.map_or(0, str::len),
        );
        let grouped = !self.group.is_empty();
        blob.push(match (session, grouped) {
            (Some(_), _) => RESERVATION_VERSION_SESSION,
            (None, true) => RESERVATION_VERSION_GROUP,
            (None, false) => RESERVATION_VERSION,
        });
        blob.push(u8::from(self.local));
        let group = (grouped || session.is_some()).then_some(self.group.as_str());
        for s in [
            self.tenant.as_str(),
            user,
            self.tier.as_str(),
            self.estimator.as_str(),
        ]
        .into_iter()
        .chain(group)
        .chain(session)
        {
            blob.extend_from_slice(&(s.len() as u16).to_be_bytes());
            blob.extend_from_slice(s.as_bytes());
        }
        blob.extend_from_slice(&self.nonce);
        write!(f, "{RESERVATION_PREFIX}{}", URL_SAFE_NO_PAD.encode(blob))
    }
}

/// A cursor over the binary form of a reservation id.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn string(&mut self) -> Option<&'a str> {
        let len = u16::from_be_bytes([self.u8()?, self.u8()?]) as usize;
        if self.0.len() < len {
            return None;
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(s).ok()
    }

    /// What follows the estimator key in an id of `version`: the model group
    /// (version 2, or 3 where it may be empty) and the session (version 3).
    fn group_and_session(&mut self, version: u8) -> Option<(&'a str, Option<SessionId>)> {
        Some(match version {
            RESERVATION_VERSION_GROUP => (self.string().filter(|g| is_tier_name(g))?, None),
            RESERVATION_VERSION_SESSION => {
                let group = self.string().filter(|g| g.is_empty() || is_tier_name(g))?;
                (group, Some(SessionId::parse(self.string()?).ok()?))
            }
            _ => ("", None),
        })
    }

    fn rest(self) -> &'a [u8] {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(TenantId::parse("acme").is_ok());
        assert!(
            TenantId::parse("a:user:b{}").is_ok(),
            "separators are fine: keys encode ids"
        );
        assert!(TenantId::parse("").is_err());
        assert!(TenantId::parse(&"x".repeat(257)).is_err());
        assert!(TenantId::parse(&"é".repeat(128)).is_ok());
        assert_eq!(
            UserId::parse("bob\n").unwrap_err().field,
            "user_id",
            "control characters are refused"
        );
    }

    #[test]
    fn reservation_ids_round_trip_and_reject_garbage() {
        let id = ReservationId::generate(
            TenantId::parse("t:{1}").unwrap(),
            Some(UserId::parse("ü").unwrap()),
            "pro".into(),
            "gpt-4o".into(),
        );
        let text = id.to_string();
        assert_eq!(ReservationId::parse(&text).unwrap(), id);
        assert!(ReservationId::parse("rsv_AAAA").is_err());
        assert!(ReservationId::parse("hello").is_err());
        assert!(ReservationId::parse(&format!("{text}x")).is_err());
        let other = ReservationId::generate(id.tenant.clone(), None, "pro".into(), String::new());
        assert_ne!(id.owner_tag(), other.owner_tag());
        let grouped = id.clone().with_group("gpt-4o".into());
        let text = grouped.to_string();
        assert_eq!(ReservationId::parse(&text).unwrap(), grouped);
        assert_ne!(grouped.owner_tag(), id.owner_tag());
        assert_ne!(id.nonce, other.nonce);
        for group in ["", "gpt-4o"] {
            let of_session = id
                .clone()
                .with_group(group.into())
                .with_session(Some(SessionId::parse("run:{7}").unwrap()));
            let text = of_session.to_string();
            assert_eq!(ReservationId::parse(&text).unwrap(), of_session);
            assert_ne!(
                of_session.owner_tag(),
                id.clone().with_group(group.into()).owner_tag(),
                "a session is part of who may settle"
            );
        }
    }
}
