//! Every store key and hash field name is built here, and only here.
//!
//! Size: the whole key layout (single Redis and cluster) is one contract,
//! kept in one file with its tests.
//!
//! # Layout (prefix `ctxb:` by default)
//! ```text
//! ctxb:g                       hash   global level: buckets and leases
//! ctxb:{T}:t                   hash   tenant level
//! ctxb:{T}:u:<U>               hash   one user of the tenant
//! ctxb:{T}:s:<U>:<S>           hash   one session of that user (`U` empty: of
//!                                     the tenant's calls naming no user);
//!                                     expires after the tier's session_ttl unused
//! <level key>:m:<G>            hash   model group G's concurrency slots at that level
//! ctxb:{T}:r:<nonce>           string one reservation's record
//! ctxb:{T}:i:<K>               string idempotency key → reservation nonce
//! ctxb:e:<M>                   list   adaptive estimator samples of key M
//! ctxb:o:<M>:<R>               list   completions (output tokens) under estimator key M, tier R
//! ctxb:{T}:l:h:<hour>          hash   usage ledger: one hour's rows, field <group>
//! ctxb:{T}:l:d:<day>           hash   usage ledger: one UTC day's rows, field <group>:<U>
//! ctxb:{T}:a                   zset   alerts to send: event id → when due (µs)
//! ctxb:{T}:a:e                 hash   their records (event id → record) and attempts
//!                                     (n:<event id>)
//! ctxb:a                       zset   the tenants' alert queues with alerts in them,
//!                                     by their earliest due (µs)
//! ctxb:a:dropped               string alerts dropped (a full queue, or given up;
//!                                     on a cluster also each queue's `dropped` field)
//! ctxb:{a}, ctxb:{a}:seen      zset, hash  on a cluster, the index, and when each queue
//!                                     was last seen (`lua/alert_index.lua`)
//! ctxb:a:recent                list   the last alerts sent or dropped (JSON), newest first
//! ctxb:{q:<G>}:v               hash   a shared level's line of waiting calls: its fair
//!                                     clocks, tenants' last finishes, owners' liveness
//!                                     (`<G>` a model group, empty for the account's own)
//! ctxb:{q:<G>}:0, :1, :2       zset   its tickets of the critical, normal and batch classes
//! ctxb:q:wake                  channel its wake-ups and counts (`lua/line.lua`)
//! ```
//! Ledger hours and days are counted from the Unix epoch (`h:491904` is
//! 2026-02-14T00:00Z); each row is `domain::budget::ledger::Row`.
//! A model group's rate limits are buckets in the level's own hash (their ids
//! carry the group's tag); only its concurrency slots need a key of their own.
//! `G` is the group name, whose characters (`A-Z a-z 0-9 - _ .`) include no
//! `:`, `{` or `}`; the slots key of a tenant's level keeps the tenant's hash tag.
//! `T`, `U`, `S` and `K` are the tenant id, user id, session id and idempotency key in unpadded
//! base64url. Its alphabet (`A-Z a-z 0-9 - _`) has no `:`, `{` or `}`, and the
//! encoding is injective, so no two (tenant, user) pairs share a key and no id
//! can end the hash tag early or forge a separator. `{T}` is a Redis Cluster
//! hash tag: all of a tenant's keys, its users' included, hash to one slot.
//!
//! # On a Redis Cluster ([`Keys::clustered`])
//! No script touches two slots. The global level's keys carry the tag `{g}`
//! (`ctxb:{g}`, `ctxb:{g}:m:<G>`, and `ctxb:{g}:x`, the slot releases sent
//! to the replica that leased them: see `store::cluster`), so one script
//! leases all of them at once, in a slot of its own; the budget scripts are
//! given only a tenant's keys; an estimator sample is pushed apart from the
//! settle script; the configuration's keys carry the tag `{cfg}`.
//!
//! # Live configuration (see `store::config_repo`)
//! ```text
//! ctxb:cfg                     hash   version; global; model:<group>; tier:<name>; override:<tenant>
//! ctxb:cfg:audit               stream every change (capped)
//! ctxb:cfg:changed             channel the new version, on every change
//! ```
//! Tier names and tenant ids appear raw in the configuration hash's field
//! names: a field name is no key, so no hash tag or separator is at stake.
//!
//! # Level hash fields
//! ```text
//! s           the level's state: buckets and lease count (see `domain::budget::state`)
//! o           a learned output's overrun credit and when it was written (µs):
//!             two little-endian doubles (see `domain::output`)
//! #<nonce>    one live lease: its expiry in µs, a little-endian double
//! a<id>:<bp>  an alert threshold's marker (bucket id, threshold in basis points):
//!             the window it last fired in, or when it last crossed (µs, a double)
//! ```

use super::Scope;
use crate::domain::budget::ledger::{LedgerRow, Period, Row};
use crate::domain::{IdempotencyKey, Level, LevelPlan, ReservationId, SessionId, TenantId, UserId};
use base64::Engine;
use base64::display::Base64Display;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "ctxb:";

/// A key prefix that would move the Redis Cluster hash tag.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key prefix {prefix:?} must not contain '{{' or '}}'")]
pub struct KeyPrefixError {
    /// The prefix refused.
    pub prefix: String,
}

/// For callers that report settings problems as text (configuration errors).
impl From<KeyPrefixError> for String {
    fn from(e: KeyPrefixError) -> String {
        e.to_string()
    }
}

/// Builds keys under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    /// The Redis Cluster layout: the global level and the configuration in
    /// hash-tagged slots of their own.
    cluster: bool,
}

impl Keys {
    /// Keys under `prefix`, which must not contain `{` or `}` (they would move
    /// the Redis Cluster hash tag).
    pub fn new(prefix: &str) -> Result<Self, KeyPrefixError> {
        if prefix.contains(['{', '}']) {
            return Err(KeyPrefixError {
                prefix: prefix.to_owned(),
            });
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
            cluster: false,
        })
    }

    /// The same keys in the Redis Cluster layout (see the module docs).
    pub fn clustered(self) -> Keys {
        Keys {
            cluster: true,
            ..self
        }
    }

    /// True for the Redis Cluster layout.
    pub fn is_clustered(&self) -> bool {
        self.cluster
    }

    /// The slot releases other replicas send to the replicas that leased the
    /// global concurrency slots (cluster layout only).
    pub fn global_messages(&self) -> String {
        format!("{}{{g}}:x", self.prefix)
    }

    /// The keys of a shared level's line (`lua/line.lua`): its state, its
    /// tenants' first tickets of each priority class, and their other
    /// tickets, all under one hash tag. `line` is a model group, or "" for
    /// the account's own limits.
    pub fn line(&self, line: &str) -> [String; 5] {
        let base = format!("{}{{q:{line}}}", self.prefix);
        [
            format!("{base}:v"),
            format!("{base}:0"),
            format!("{base}:1"),
            format!("{base}:2"),
            format!("{base}:p"),
        ]
    }

    /// The channel the lines' wake-ups and counts go out on.
    pub fn line_channel(&self) -> String {
        format!("{}q:wake", self.prefix)
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn tenant_tag(&self, tenant: &TenantId) -> String {
        format!("{}{{{}}}", self.prefix, b64(tenant.as_str()))
    }

    /// The keys of `tenant`, its hash tag built once: an operation that
    /// names several (a reservation names its levels, record, idempotency
    /// entry and ledger rows) builds them from it.
    pub fn of_tenant(&self, tenant: &TenantId) -> TenantKeys<'_> {
        TenantKeys {
            keys: self,
            tag: self.tenant_tag(tenant),
        }
    }

    /// The global level's hash.
    fn global_level(&self) -> String {
        match self.cluster {
            true => format!("{}{{g}}", self.prefix),
            false => format!("{}g", self.prefix),
        }
    }

    /// The queue of alerts `tenant`'s calls crossed, and its records' hash.
    pub fn alert_queue(&self, tenant: &TenantId) -> (String, String) {
        let q = format!("{}:a", self.tenant_tag(tenant));
        let e = format!("{q}:e");
        (q, e)
    }

    /// The index of alert queues that hold alerts, by their earliest due
    /// (hash-tagged on a cluster, with [`Keys::alert_seen`]).
    pub fn alert_index(&self) -> String {
        match self.cluster {
            true => format!("{}{{a}}", self.prefix),
            false => format!("{}a", self.prefix),
        }
    }

    /// On a cluster: when each indexed alert queue was last seen (µs).
    pub fn alert_seen(&self) -> String {
        format!("{}{{a}}:seen", self.prefix)
    }

    /// The count of alerts dropped.
    pub fn alert_dropped(&self) -> String {
        format!("{}a:dropped", self.prefix)
    }

    /// The last alerts sent or dropped.
    pub fn alert_recent(&self) -> String {
        format!("{}a:recent", self.prefix)
    }

    /// A pattern for SCAN matching every tenant's alert queue.
    pub fn alert_queue_pattern(&self) -> String {
        format!("{}{{*}}:a", self.prefix)
    }

    /// The tenant of an alert queue key.
    pub fn parse_alert_queue(&self, key: &str) -> Option<TenantId> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('{')?;
        let (tenant, rest) = rest.split_once('}')?;
        (rest == ":a").then_some(())?;
        TenantId::parse(&decode(tenant)?).ok()
    }

    /// The level, tenant, user and session a level key names (`None` for the
    /// global level's tenant, and for a key of no level).
    pub fn parse_level(&self, key: &str) -> Option<ParsedLevel> {
        let rest = key.strip_prefix(&self.prefix)?;
        if rest == "g" || rest == "{g}" {
            return Some(ParsedLevel {
                level: Level::Global,
                tenant: None,
                user: None,
                session: None,
            });
        }
        let (tenant, rest) = rest.strip_prefix('{')?.split_once('}')?;
        let tenant = Some(TenantId::parse(&decode(tenant)?).ok()?);
        let id = |s: &str| decode(s);
        let parsed = |level, user: Option<String>, session: Option<String>| {
            Some(ParsedLevel {
                level,
                tenant: tenant.clone(),
                user: match user {
                    Some(u) => Some(UserId::parse(&u).ok()?),
                    None => None,
                },
                session: match session {
                    Some(s) => Some(SessionId::parse(&s).ok()?),
                    None => None,
                },
            })
        };
        match rest.strip_prefix(':')?.split(':').collect::<Vec<_>>()[..] {
            ["t"] => parsed(Level::Tenant, None, None),
            ["u", u] => parsed(Level::User, Some(id(u)?), None),
            ["s", "", s] => parsed(Level::Session, None, Some(id(s)?)),
            ["s", u, s] => parsed(Level::Session, Some(id(u)?), Some(id(s)?)),
            _ => None,
        }
    }

    /// The hash of one level of `who`: the tenant's, its user's at the user
    /// level, its session's at the session level. A user level `who` names
    /// no user of is the tenant's; a session level is planned only for a
    /// session.
    pub fn level(&self, level: Level, who: Scope<'_>) -> String {
        match level {
            Level::Global => self.global_level(),
            _ => self.of_tenant(who.tenant).level(level, who),
        }
    }

    /// The key of one entry of a plan: its level's hash, or — for a model
    /// group's slots — that hash's name with `:m:<group>` after it.
    pub fn plan_level(&self, lp: &LevelPlan, who: Scope<'_>) -> String {
        with_slots(self.level(lp.level, who), lp)
    }

    /// The record of one reservation.
    pub fn record(&self, id: &ReservationId) -> String {
        self.of_tenant(&id.tenant).record(id)
    }

    /// What every record key of `tenant` starts with, the nonce following:
    /// reserve.lua finds an idempotent replay's record from it and the
    /// nonce its idempotency entry holds.
    pub fn record_prefix(&self, tenant: &TenantId) -> String {
        self.of_tenant(tenant).record_prefix()
    }

    /// The idempotency entry of one key within a tenant.
    pub fn idempotency(&self, tenant: &TenantId, key: &IdempotencyKey) -> String {
        self.of_tenant(tenant).idempotency(key)
    }
}

impl Keys {
    /// The keys of quotas in shadow: the same layout under `<prefix>shadow:`.
    pub fn shadow(&self) -> Keys {
        Keys {
            prefix: format!("{}shadow:", self.prefix),
            cluster: self.cluster,
        }
    }

    /// The list of estimator samples of one estimator key.
    pub fn estimator(&self, key: &str) -> String {
        format!("{}e:{}", self.prefix, b64(key))
    }

    /// The list of completions' output tokens under estimator key `key` and
    /// tier `tier` (what a learned output reservation learns from).
    pub fn output_samples(&self, key: &str, tier: &str) -> String {
        format!("{}o:{}:{}", self.prefix, b64(key), b64(tier))
    }

    /// What every ledger key of `tenant` starts with: the scripts append
    /// `h:<hour>` or `d:<day>`.
    pub fn ledger_base(&self, tenant: &TenantId) -> String {
        self.of_tenant(tenant).ledger_base()
    }

    /// The hash of `tenant`'s ledger rows of one hour or day.
    pub fn ledger(&self, tenant: &TenantId, period: Period) -> String {
        self.of_tenant(tenant).ledger(period)
    }

    /// A pattern for SCAN matching every tenant's hourly (or daily) ledger keys.
    pub fn ledger_pattern(&self, hourly: bool) -> String {
        let kind = if hourly { 'h' } else { 'd' };
        format!("{}{{*}}:l:{kind}:*", self.prefix)
    }

    /// The tenant and period of a ledger key, if it is one under this prefix.
    pub fn parse_ledger(&self, key: &str) -> Option<(TenantId, Period)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('{')?;
        let (tenant, rest) = rest.split_once('}')?;
        let rest = rest.strip_prefix(":l:")?;
        let period = match rest.split_at_checked(2)? {
            ("h:", n) => Period::Hour(n.parse().ok()?),
            ("d:", n) => Period::Day(n.parse().ok()?),
            _ => return None,
        };
        Some((TenantId::parse(&decode(tenant)?).ok()?, period))
    }
}

/// The fields of a reservation's ledger rows: in the hourly hash its model
/// group (empty: none); in the daily hash `<group>:<user>` (the user in
/// unpadded base64url, empty: none). A group name has no `:`.
pub fn ledger_fields(group: &str, user: Option<&UserId>) -> (String, String) {
    let user = b64(user.map_or("", |u| u.as_str()));
    (group.to_owned(), format!("{group}:{user}"))
}

/// A ledger row's field (of an hourly or a daily hash) and the row, as a
/// report reads them; `None` for a field this layout does not make.
pub fn ledger_row(period: Period, field: &str, row: Row) -> Option<LedgerRow> {
    let (group, user) = match period {
        Period::Hour(_) => (field, None),
        Period::Day(_) => parse_ledger_day_field(field)?,
    };
    Some(LedgerRow {
        group: group.to_owned(),
        user,
        row,
    })
}

/// A daily ledger field back to its group and user.
pub fn parse_ledger_day_field(field: &str) -> Option<(&str, Option<UserId>)> {
    let (group, user) = field.split_once(':')?;
    let user = match user {
        "" => None,
        u => Some(UserId::parse(&decode(u)?).ok()?),
    };
    Some((group, user))
}

/// Who a level key names ([`Keys::parse_level`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedLevel {
    /// The level.
    pub level: Level,
    /// Its tenant (`None` at the global level).
    pub tenant: Option<TenantId>,
    /// Its user, at the user and session levels.
    pub user: Option<UserId>,
    /// Its session, at the session level.
    pub session: Option<SessionId>,
}

/// The hash field of a reservation's lease.
pub fn lease_field(id: &ReservationId) -> String {
    crate::domain::budget::Lease::of(id).field()
}

/// The hash of the live configuration under `prefix` (hash-tagged on a
/// cluster, so the change script's keys share a slot).
pub fn config_hash(prefix: &str, cluster: bool) -> String {
    match cluster {
        true => format!("{prefix}{{cfg}}"),
        false => format!("{prefix}cfg"),
    }
}

/// The audit stream of configuration changes under `prefix`.
pub fn config_audit(prefix: &str, cluster: bool) -> String {
    match cluster {
        true => format!("{prefix}{{cfg}}:audit"),
        false => format!("{prefix}cfg:audit"),
    }
}

/// The channel configuration changes are announced on under `prefix`.
pub fn config_channel(prefix: &str) -> String {
    format!("{prefix}cfg:changed")
}

/// Field names of the configuration hash.
pub mod config_field {
    /// The configuration version.
    pub const VERSION: &str = "version";
    /// The global limits.
    pub const GLOBAL: &str = "global";
    /// How Envoy's descriptors map to levels (`[envoy]`).
    pub const ENVOY: &str = "envoy";
    /// How the external processor reads requests (`[ext_proc]`).
    pub const EXT_PROC: &str = "ext_proc";
    const TIER: &str = "tier:";
    const OVERRIDE: &str = "override:";
    const MODEL: &str = "model:";
    const PRICE: &str = "price:";

    /// The field of model group `name`'s prices.
    pub fn price(name: &str) -> String {
        format!("{PRICE}{name}")
    }

    /// The model group a field holds the prices of, if it holds prices.
    pub fn as_price(field: &str) -> Option<&str> {
        field.strip_prefix(PRICE)
    }

    /// The field of model group `name`.
    pub fn model(name: &str) -> String {
        format!("{MODEL}{name}")
    }

    /// The model group a field holds, if it holds one.
    pub fn as_model(field: &str) -> Option<&str> {
        field.strip_prefix(MODEL)
    }

    /// The field of tier `name`.
    pub fn tier(name: &str) -> String {
        format!("{TIER}{name}")
    }

    /// The field of `tenant`'s override.
    pub fn override_of(tenant: &str) -> String {
        format!("{OVERRIDE}{tenant}")
    }

    /// The tier name a field holds, if it holds a tier.
    pub fn as_tier(field: &str) -> Option<&str> {
        field.strip_prefix(TIER)
    }

    /// The tenant a field holds the override of, if it holds one.
    pub fn as_override(field: &str) -> Option<&str> {
        field.strip_prefix(OVERRIDE)
    }

    /// The field holding the configuration version of document `field`'s
    /// last change (`changed:tier:pro`): what a write naming the version it
    /// read at is checked against. No document kind's prefix begins so.
    pub fn changed(field: &str) -> String {
        format!("changed:{field}")
    }
}

/// The keys of one tenant, from [`Keys::of_tenant`]: each key the same as
/// [`Keys`]'s method of the same name builds, the tenant's hash tag built
/// once.
pub struct TenantKeys<'a> {
    keys: &'a Keys,
    /// `<prefix>{<tenant>}`.
    tag: String,
}

impl TenantKeys<'_> {
    /// As [`Keys::level`], for a scope of this tenant.
    pub fn level(&self, level: Level, who: Scope<'_>) -> String {
        match (level, who.user, who.session) {
            (Level::Global, ..) => self.keys.global_level(),
            (Level::Session, user, Some(s)) => format!(
                "{}:s:{}:{}",
                self.tag,
                b64(user.map_or("", |u| u.as_str())),
                b64(s.as_str())
            ),
            (Level::User | Level::Session, Some(u), _) => {
                debug_assert!(
                    level == Level::User,
                    "a session level planned without a session"
                );
                format!("{}:u:{}", self.tag, b64(u.as_str()))
            }
            (Level::Tenant | Level::User | Level::Session, ..) => {
                debug_assert!(
                    level != Level::Session,
                    "a session level planned without a session"
                );
                format!("{}:t", self.tag)
            }
        }
    }

    /// As [`Keys::plan_level`].
    pub fn plan_level(&self, lp: &LevelPlan, who: Scope<'_>) -> String {
        with_slots(self.level(lp.level, who), lp)
    }

    /// As [`Keys::record`], for a reservation of this tenant.
    pub fn record(&self, id: &ReservationId) -> String {
        format!(
            "{}:r:{}",
            self.tag,
            Base64Display::new(&id.nonce, &URL_SAFE_NO_PAD)
        )
    }

    /// As [`Keys::record_prefix`].
    pub fn record_prefix(&self) -> String {
        format!("{}:r:", self.tag)
    }

    /// As [`Keys::idempotency`].
    pub fn idempotency(&self, key: &IdempotencyKey) -> String {
        format!("{}:i:{}", self.tag, b64(key.as_str()))
    }

    /// As [`Keys::ledger_base`].
    pub fn ledger_base(&self) -> String {
        format!("{}:l:", self.tag)
    }

    /// As [`Keys::ledger`].
    pub fn ledger(&self, period: Period) -> String {
        match period {
            Period::Hour(h) => format!("{}:l:h:{h}", self.tag),
            Period::Day(d) => format!("{}:l:d:{d}", self.tag),
        }
    }
}

/// A level's key, or its model group's slots' (`:m:<group>` after it).
fn with_slots(level: String, lp: &LevelPlan) -> String {
    match (lp.slots, &lp.group) {
        (true, Some(g)) => format!("{level}:m:{}", g.name),
        _ => level,
    }
}

/// `id` in unpadded base64url, written where it is formatted (no string of
/// its own).
fn b64(id: &str) -> Base64Display<'_, 'static, base64::engine::GeneralPurpose> {
    Base64Display::new(id.as_bytes(), &URL_SAFE_NO_PAD)
}

fn decode(encoded: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(encoded).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SessionId;
    use std::collections::HashSet;

    fn slot_tag(key: &str) -> &str {
        let open = key.find('{').expect("tenant keys carry a hash tag");
        let close = open + key[open..].find('}').expect("closed tag");
        &key[open + 1..close]
    }

    #[test]
    fn level_and_alert_queue_keys_read_back() {
        let keys = Keys::new(DEFAULT_PREFIX).unwrap();
        let tenant = TenantId::parse("t{1}:x").unwrap();
        let user = UserId::parse("alice").unwrap();
        let session = SessionId::parse("s:{1}").unwrap();
        for (level, user, session) in [
            (Level::Global, None, None),
            (Level::Tenant, None, None),
            (Level::User, Some(&user), None),
            (Level::Session, Some(&user), Some(&session)),
            (Level::Session, None, Some(&session)),
        ] {
            let who = Scope {
                tenant: &tenant,
                user,
                session,
            };
            let parsed = keys.parse_level(&keys.level(level, who)).unwrap();
            let tenant = (level != Level::Global).then(|| tenant.clone());
            let want = ParsedLevel {
                level,
                tenant,
                user: user.cloned(),
                session: session.cloned(),
            };
            assert_eq!(parsed, want);
        }
        assert_eq!(keys.parse_level("ctxb:{dA}:l:h:1"), None);
        let (queue, records) = keys.alert_queue(&tenant);
        assert_eq!(keys.parse_alert_queue(&queue), Some(tenant));
        assert_eq!(keys.parse_alert_queue(&records), None);
    }

    #[test]
    fn hostile_ids_cannot_collide_or_move_slots() {
        let keys = Keys::new(DEFAULT_PREFIX).unwrap();
        let pairs = [
            ("a", Some("b")),
            ("a:u:b", None),
            ("a", Some("b:t")),
            ("a}", Some("b")),
            ("{a", Some("b")),
            ("a:user:b", Some("c")),
            ("a", Some("user:b:c")),
        ];
        let mut seen = HashSet::new();
        for (t, u) in pairs {
            let tenant = TenantId::parse(t).unwrap();
            let user = u.map(|u| UserId::parse(u).unwrap());
            let user_key = keys.level(
                Level::User,
                Scope {
                    tenant: &tenant,
                    user: user.as_ref(),
                    session: None,
                },
            );
            let tenant_key = keys.level(
                Level::Tenant,
                Scope {
                    tenant: &tenant,
                    user: None,
                    session: None,
                },
            );
            assert_eq!(
                slot_tag(&user_key),
                slot_tag(&tenant_key),
                "one slot per tenant"
            );
            assert_eq!(
                user_key.matches(['{', '}']).count(),
                2,
                "ids never add braces"
            );
            if user.is_some() {
                assert!(seen.insert(user_key), "user key reused for {t:?}/{u:?}");
            }
        }
    }

    #[test]
    fn session_keys_are_their_users_and_share_the_tenants_slot() {
        let keys = Keys::new(DEFAULT_PREFIX).unwrap().clustered();
        let tenant = TenantId::parse("t:{1}").unwrap();
        let users = [
            None,
            Some(UserId::parse("a").unwrap()),
            Some(UserId::parse("a:b").unwrap()),
        ];
        let sessions = ["s", "b:s", ":", "s}{"].map(|s| SessionId::parse(s).unwrap());
        let tenant_key = keys.level(Level::Tenant, Scope::new(&tenant, None));
        let mut seen = std::collections::HashSet::new();
        for user in &users {
            let user_key = keys.level(Level::User, Scope::new(&tenant, user.as_ref()));
            seen.insert(user_key);
            for session in &sessions {
                let who = Scope {
                    session: Some(session),
                    ..Scope::new(&tenant, user.as_ref())
                };
                let key = keys.level(Level::Session, who);
                assert_eq!(slot_tag(&key), slot_tag(&tenant_key), "{key}");
                assert!(seen.insert(key.clone()), "{key} reused");
            }
        }
    }

    #[test]
    fn ledger_keys_and_fields_read_back() {
        let keys = Keys::new(DEFAULT_PREFIX).unwrap();
        let tenant = TenantId::parse("acme:{x}").unwrap();
        let key = keys.ledger(&tenant, Period::Hour(491_904));
        assert_eq!(
            slot_tag(&key),
            slot_tag(&keys.level(
                Level::Tenant,
                Scope {
                    tenant: &tenant,
                    user: None,
                    session: None
                }
            ))
        );
        assert_eq!(
            keys.parse_ledger(&key),
            Some((tenant.clone(), Period::Hour(491_904)))
        );
        let day = keys.ledger(&tenant, Period::Day(20_496));
        assert_eq!(keys.parse_ledger(&day), Some((tenant, Period::Day(20_496))));
        assert_eq!(keys.parse_ledger("ctxb:{YQ}:t"), None);
        let user = UserId::parse("bob:1").unwrap();
        let (hour, day) = ledger_fields("gpt-4o", Some(&user));
        assert_eq!(hour, "gpt-4o");
        assert_eq!(parse_ledger_day_field(&day), Some(("gpt-4o", Some(user))));
        assert_eq!(
            parse_ledger_day_field(&ledger_fields("", None).1),
            Some(("", None))
        );
    }

    #[test]
    fn prefix_with_braces_is_refused() {
        let refused = Keys::new("a{b}:").unwrap_err();
        assert_eq!(
            refused.to_string(),
            r#"key prefix "a{b}:" must not contain '{' or '}'"#
        );
    }
}
