//! `[auth]`: the bearer tokens callers must present, as configured, and the
//! rules they must follow. The application layer (`app::caller`) checks
//! callers against them.

use crate::domain::LimitsError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// `[auth]`: the bearer tokens callers must present. No tokens: anyone who
/// can reach the listener may call (fine on a private network, nowhere else).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    /// Accepted tokens; during a rotation, list the new one beside the old.
    #[serde(default)]
    pub tokens: Vec<TokenSection>,
}

/// One accepted token as configured.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// A name for logs and errors (the token itself never appears).
    pub name: String,
    /// The secret.
    pub token: String,
    /// Tenants this token may act for; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<BTreeSet<String>>,
    /// What the token may do.
    #[serde(default, skip_serializing_if = "Role::is_caller")]
    pub role: Role,
}

/// What a token may do.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reserve, settle and read status (gRPC and `/v1/*`).
    #[default]
    Caller,
    /// All a caller may, for every tenant, and the admin API and console
    /// (`/admin/v1/*`, `/console`): change quotas, read usage.
    Admin,
}

impl Role {
    fn is_caller(&self) -> bool {
        *self == Role::Caller
    }
}

impl std::fmt::Debug for TokenSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSection")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("tenants", &self.tenants)
            .field("role", &self.role)
            .finish()
    }
}

/// An admin token acts for every tenant: one bound to tenants is refused.
fn admin_for_all(i: usize, t: &TokenSection) -> Result<(), LimitsError> {
    if t.role == Role::Admin && t.tenants.is_some() {
        return Err(LimitsError::new(
            format!("auth.tokens[{i}].tenants"),
            format!(
                "token {:?} is an admin token, which acts for every tenant: drop `tenants`, \
                 or give the tenant-bound caller a token of role \"caller\"",
                t.name
            ),
        ));
    }
    Ok(())
}

/// Shortest token accepted: anything shorter can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// Checks configured tokens: names and secrets unique, secrets long enough,
/// printable and without spaces (they travel in an HTTP/2 header), tenant
/// sets not empty. The error names the field (`auth.tokens[i].token`) and
/// never quotes a secret.
pub fn validate_tokens(tokens: &[TokenSection]) -> Result<(), LimitsError> {
    let problem =
        |field: String, problem: String| LimitsError::new(format!("auth.tokens{field}"), problem);
    for (i, t) in tokens.iter().enumerate() {
        let at = |field: &str| format!("[{i}].{field}");
        if t.name.trim().is_empty() {
            return Err(problem(at("name"), "must not be empty".into()));
        }
        if t.token.len() < MIN_TOKEN_LEN {
            return Err(problem(
                at("token"),
                format!(
                    "token {:?} is shorter than {MIN_TOKEN_LEN} characters; generate one with \
                     `openssl rand -hex 32`",
                    t.name
                ),
            ));
        }
        if !t.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(problem(
                at("token"),
                format!("token {:?} must be printable ASCII without spaces", t.name),
            ));
        }
        if matches!(&t.tenants, Some(set) if set.is_empty()) {
            return Err(problem(
                at("tenants"),
                format!(
                    "token {:?} is bound to no tenant: list tenants, or drop `tenants` to allow all",
                    t.name
                ),
            ));
        }
        admin_for_all(i, t)?;
        for earlier in &tokens[..i] {
            if earlier.name == t.name {
                return Err(problem(
                    at("name"),
                    format!("token name {:?} appears twice", t.name),
                ));
            }
            if earlier.token == t.token {
                return Err(problem(
                    at("token"),
                    format!(
                        "tokens {:?} and {:?} are the same secret",
                        earlier.name, t.name
                    ),
                ));
            }
        }
    }
    Ok(())
}
