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
    /// The secret (or `token_file`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
    /// A file that holds the secret (a mounted Kubernetes Secret), read at
    /// start and on every SIGHUP; surrounding whitespace is dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<std::path::PathBuf>,
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
            .field("token_file", &self.token_file)
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

/// `tokens` with each `token_file` read into its token: the secrets the
/// service checks. A file that cannot be read, or a token given both ways,
/// names the token's entry.
pub fn read_token_files(mut tokens: Vec<TokenSection>) -> Result<Vec<TokenSection>, LimitsError> {
    for (i, t) in tokens.iter_mut().enumerate() {
        let Some(path) = t.token_file.take() else {
            continue;
        };
        let field = format!("auth.tokens[{i}].token_file");
        if !t.token.is_empty() {
            return Err(LimitsError::new(
                field,
                format!(
                    "token {:?} sets both token and token_file: keep one",
                    t.name
                ),
            ));
        }
        t.token = std::fs::read_to_string(&path)
            .map_err(|e| {
                LimitsError::new(
                    field,
                    format!("token {:?}: cannot read {}: {e}", t.name, path.display()),
                )
            })?
            .trim()
            .to_string();
    }
    Ok(tokens)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(token: &str, file: Option<std::path::PathBuf>) -> TokenSection {
        TokenSection {
            name: "gateway".into(),
            token: token.into(),
            token_file: file,
            tenants: None,
            role: Role::Caller,
        }
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_one_way_only() {
        let dir = std::env::temp_dir().join(format!("ctxb-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gateway");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        let read = read_token_files(vec![entry("", Some(path.clone()))]).unwrap();
        assert_eq!(read[0].token, "0123456789abcdef0123");
        assert!(read[0].token_file.is_none());
        let both = read_token_files(vec![entry("0123456789abcdef0123", Some(path.clone()))]);
        assert!(
            both.unwrap_err()
                .to_string()
                .contains("auth.tokens[0].token_file")
        );
        let missing = read_token_files(vec![entry("", Some(dir.join("absent")))]).unwrap_err();
        assert!(missing.to_string().contains("cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
