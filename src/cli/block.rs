//! `ctxbudget overrides block|unblock`: the block of a tenant or of one user
//! of it, kept in the tenant's override beside its limits. A new deal
//! (`overrides set`) or deleting the override never lifts a block by accident:
//! only `unblock` does.

use crate::config::ConfigDoc;
use crate::config::OverrideSection;
use crate::domain::block::{Blocks, check_reason};
use crate::domain::{TenantId, UserId};
use anyhow::bail;

/// `tenant`'s override with the tenant (or `user`) blocked for `reason`;
/// nothing is written when an id or the reason is refused.
pub(super) fn block(
    doc: &ConfigDoc,
    tenant: &str,
    user: Option<&str>,
    reason: &str,
) -> anyhow::Result<OverrideSection> {
    check_ids(tenant, user)?;
    let field = match user {
        Some(u) => format!("overrides.{tenant}.blocked_users.{u}"),
        None => format!("overrides.{tenant}.blocked"),
    };
    check_reason(&field, reason).map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
    let mut section = doc.overrides.get(tenant).cloned().unwrap_or_default();
    match user {
        Some(u) => {
            section
                .blocked_users
                .insert(u.to_owned(), reason.to_owned());
        }
        None => section.blocked = Some(reason.to_owned()),
    }
    Ok(section)
}

/// `tenant`'s override with the block of the tenant (or of `user`) lifted;
/// an error when there is no such block.
pub(super) fn unblock(
    doc: &ConfigDoc,
    tenant: &str,
    user: Option<&str>,
) -> anyhow::Result<OverrideSection> {
    check_ids(tenant, user)?;
    let mut section = doc.overrides.get(tenant).cloned().unwrap_or_default();
    let lifted = match user {
        Some(u) => section.blocked_users.remove(u).is_some(),
        None => section.blocked.take().is_some(),
    };
    if !lifted {
        let blocks = Blocks {
            tenant: section.blocked.clone(),
            users: section.blocked_users.clone(),
        };
        let who = match user {
            Some(u) => format!("user {u} of tenant {tenant}"),
            None => format!("tenant {tenant}"),
        };
        bail!(
            "{who} is not blocked; nothing was written ({})",
            describe(&blocks)
        );
    }
    Ok(section)
}

/// What is blocked of a tenant, in words.
fn describe(blocks: &Blocks) -> String {
    if blocks.is_empty() {
        return "nothing of this tenant is blocked".into();
    }
    let mut parts = Vec::new();
    if blocks.tenant.is_some() {
        parts.push("the whole tenant is blocked".to_owned());
    }
    if !blocks.users.is_empty() {
        let users: Vec<&str> = blocks.users.keys().map(String::as_str).collect();
        parts.push(format!("blocked users: {}", users.join(", ")));
    }
    parts.join("; ")
}

fn check_ids(tenant: &str, user: Option<&str>) -> anyhow::Result<()> {
    TenantId::parse(tenant).map_err(|e| anyhow::anyhow!("TENANT: {}", e.message))?;
    if let Some(u) = user {
        UserId::parse(u).map_err(|e| anyhow::anyhow!("--user: {}", e.message))?;
    }
    Ok(())
}
