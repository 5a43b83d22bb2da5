//! The block of a tenant or of one user of it, kept in the tenant's override
//! beside its limits (`ctxbudget overrides block|unblock`, and the admin
//! API's `/admin/v1/overrides/{tenant}/block`). A new deal or deleting the
//! override never lifts a block by accident: only an unblock does.

use super::{AdminError, Change, Kind, documents};
use crate::config::ConfigDoc;
use crate::config::live::document;
use crate::domain::block::{Blocks, check_reason};
use crate::domain::{TenantId, UserId};

/// `tenant`'s override with the tenant (or `user`) blocked for `reason`,
/// checked as a whole in `doc` (left holding it); nothing is written when
/// an id or the reason is refused.
pub fn block(
    doc: &mut ConfigDoc,
    tenant: &str,
    user: Option<&str>,
    reason: &str,
) -> Result<Change, AdminError> {
    check_ids(tenant, user)?;
    let existed = doc.overrides.contains_key(tenant);
    let field = match user {
        Some(u) => format!("overrides.{tenant}.blocked_users.{u}"),
        None => format!("overrides.{tenant}.blocked"),
    };
    check_reason(&field, reason)
        .map_err(|e| AdminError::Invalid(format!("{e}; nothing was written")))?;
    let mut section = doc.overrides.get(tenant).cloned().unwrap_or_default();
    match user {
        Some(u) => {
            section
                .blocked_users
                .insert(u.to_owned(), reason.to_owned());
        }
        None => section.blocked = Some(reason.to_owned()),
    }
    doc.overrides.insert(tenant.to_owned(), section.clone());
    documents::check_whole(doc)?;
    Ok(Change {
        field: Kind::Override.field(tenant),
        document: Some(document(&section)),
        note: None,
        existed,
    })
}

/// `tenant`'s override with the block of the tenant (or of `user`) lifted
/// (deleted when nothing is left of it); an error when there is no such block.
pub fn unblock(doc: &ConfigDoc, tenant: &str, user: Option<&str>) -> Result<Change, AdminError> {
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
        return Err(AdminError::NotFound(format!(
            "{who} is not blocked; nothing was written ({})",
            describe(&blocks)
        )));
    }
    Ok(Change {
        field: Kind::Override.field(tenant),
        document: (!section.is_empty()).then(|| document(&section)),
        note: None,
        existed: true,
    })
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

fn check_ids(tenant: &str, user: Option<&str>) -> Result<(), AdminError> {
    TenantId::parse(tenant).map_err(|e| AdminError::Invalid(format!("tenant: {}", e.message)))?;
    if let Some(u) = user {
        UserId::parse(u).map_err(|e| AdminError::Invalid(format!("user: {}", e.message)))?;
    }
    Ok(())
}
