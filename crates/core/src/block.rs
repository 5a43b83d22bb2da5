//! Blocks: an operator refusing all traffic of one tenant, or of one user of a
//! tenant, at once (`ctxbudget overrides block`), short of deleting its tier —
//! envoyproxy/ratelimit's `requests_per_unit: 0`, LiteLLM's blocked keys.
//! Stored with the tenant's override; every API refuses the blocked scope
//! (`Denial::blocked`, reason `Blocked`), while reservations made before the
//! block still settle.

use super::level::Level;
use super::tier::LimitsError;
use std::collections::BTreeMap;

/// Longest reason an operator may give, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A request refused by a block: at which level, whose scope, and the
/// operator's reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockedScope<'a> {
    /// Tenant or user.
    pub level: Level,
    /// The scope in words: `tenant acme`, `user bob of tenant acme`.
    pub who: String,
    /// Why, as the operator said it.
    pub reason: &'a str,
}

/// What of a tenant is blocked, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocks {
    /// The whole tenant, with the operator's reason.
    pub tenant: Option<String>,
    /// Users of the tenant, each with the operator's reason.
    pub users: BTreeMap<String, String>,
}

impl Blocks {
    /// True when nothing is blocked.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_none() && self.users.is_empty()
    }

    /// The block that refuses a request of `tenant` (and `user`), if its
    /// scope is blocked: the tenant's first, as it covers every user.
    pub fn refusal(&self, tenant: &str, user: Option<&str>) -> Option<BlockedScope<'_>> {
        if let Some(reason) = &self.tenant {
            return Some(BlockedScope {
                level: Level::Tenant,
                who: format!("tenant {tenant}"),
                reason,
            });
        }
        let user = user?;
        let reason = self.users.get(user)?;
        Some(BlockedScope {
            level: Level::User,
            who: format!("user {user} of tenant {tenant}"),
            reason,
        })
    }

    /// Checks the reasons and user ids; `path` prefixes field names.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        if let Some(reason) = &self.tenant {
            check_reason(&format!("{path}.blocked"), reason)?;
        }
        for (user, reason) in &self.users {
            let field = format!("{path}.blocked_users.{user}");
            super::ids::UserId::parse(user)
                .map_err(|e| LimitsError::new(&field, format!("user id: {}", e.message)))?;
            check_reason(&field, reason)?;
        }
        Ok(())
    }
}

/// A reason people read in denials: 1 to [`MAX_REASON_CHARS`] characters,
/// none of them control characters.
pub fn check_reason(field: &str, reason: &str) -> Result<(), LimitsError> {
    let chars = reason.chars().count();
    if reason.trim().is_empty() || chars > MAX_REASON_CHARS {
        return Err(LimitsError::new(
            field,
            format!(
                "a block needs a reason of 1 to {MAX_REASON_CHARS} characters (it is shown to \
                 the blocked caller); got {chars}"
            ),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(LimitsError::new(
            field,
            "the reason must not hold control characters (it is sent in headers and logs)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenants_block_covers_its_users_and_a_users_block_only_that_user() {
        let mut b = Blocks::default();
        assert!(b.refusal("acme", Some("alice")).is_none());
        b.users.insert("alice".into(), "abuse report 42".into());
        let d = b.refusal("acme", Some("alice")).unwrap();
        assert_eq!((d.level, d.reason), (Level::User, "abuse report 42"));
        assert_eq!(d.who, "user alice of tenant acme");
        assert!(b.refusal("acme", Some("bob")).is_none());
        assert!(b.refusal("acme", None).is_none());
        b.tenant = Some("unpaid invoice".into());
        let d = b.refusal("acme", Some("bob")).unwrap();
        assert_eq!((d.level, d.reason), (Level::Tenant, "unpaid invoice"));
        assert_eq!(d.who, "tenant acme");
    }

    #[test]
    fn reasons_and_user_ids_are_checked() {
        let mut b = Blocks {
            tenant: Some(" ".into()),
            ..Blocks::default()
        };
        assert!(b.validate("overrides.acme").is_err());
        b.tenant = Some("line\nbreak".into());
        assert!(b.validate("overrides.acme").is_err());
        b.tenant = Some("x".repeat(MAX_REASON_CHARS + 1));
        assert!(b.validate("overrides.acme").is_err());
        b.tenant = Some("fine".into());
        b.users.insert(String::new(), "why".into());
        let e = b.validate("overrides.acme").unwrap_err();
        assert!(e.field.starts_with("overrides.acme.blocked_users"), "{e:?}");
    }
}
