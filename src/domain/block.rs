//! Blocks: an operator refusing all traffic of one tenant, or of one user of a
//! tenant, at once (`ctxbudget overrides block`), short of deleting its tier —
//! envoyproxy/ratelimit's `requests_per_unit: 0`, LiteLLM's blocked keys.
//! Stored with the tenant's override; every API refuses the blocked scope
//! with [`Reason::Blocked`], while reservations made before the block still
//! settle.

use super::denial::{Denial, Reason};
use super::level::Level;
use super::tier::LimitsError;
use std::collections::BTreeMap;

/// Longest reason an operator may give, in characters.
pub const MAX_REASON_CHARS: usize = 500;

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

    /// The refusal of a request of `tenant` (and `user`), if its scope is
    /// blocked: the tenant's block first, as it covers every user.
    pub fn refusal(&self, tenant: &str, user: Option<&str>) -> Option<Denial> {
        if let Some(reason) = &self.tenant {
            return Some(blocked(Level::Tenant, &format!("tenant {tenant}"), reason));
        }
        let user = user?;
        let reason = self.users.get(user)?;
        Some(blocked(
            Level::User,
            &format!("user {user} of tenant {tenant}"),
            reason,
        ))
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

/// The refusal of a blocked scope: no level's limit, no retry (waiting
/// cannot help), the operator's reason in the detail.
fn blocked(level: Level, who: &str, reason: &str) -> Denial {
    Denial {
        reason: Reason::Blocked,
        level: Some(level),
        dimension: None,
        period_secs: 0,
        model_group: None,
        retry_after_ms: 0,
        detail: format!(
            "{who} is blocked by the operator: {reason}; retrying cannot help until the \
             operator lifts the block"
        ),
    }
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
        assert_eq!(
            (d.reason, d.level, d.retry_after_ms),
            (Reason::Blocked, Some(Level::User), 0)
        );
        assert!(d.detail.contains("abuse report 42"), "{}", d.detail);
        assert!(b.refusal("acme", Some("bob")).is_none());
        assert!(b.refusal("acme", None).is_none());
        b.tenant = Some("unpaid invoice".into());
        let d = b.refusal("acme", Some("bob")).unwrap();
        assert_eq!(d.level, Some(Level::Tenant));
        assert!(
            d.detail
                .contains("tenant acme is blocked by the operator: unpaid invoice")
        );
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
