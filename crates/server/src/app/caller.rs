//! Who is calling: bearer tokens, compared in constant time, and what each
//! may do. Tokens are a set, so during a rotation the new token and the
//! previous one both work; SIGHUP reloads them. A token may be bound to
//! tenants: a caller naming another tenant — or settling another tenant's
//! reservation — is refused [`ErrorKind::Forbidden`], by every front door in
//! the same words. An unauthenticated call is refused
//! [`ErrorKind::Unauthenticated`] and touches nothing. Tokens never reach a
//! log. Every refusal is counted here (`ctxbudget_auth_refused_total`).

use super::error::{AppError, ErrorKind};
pub use crate::config::{MIN_TOKEN_LEN, Role, TokenSection};
use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;

/// Who is calling, once authenticated.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    tenants: Option<BTreeSet<String>>,
    role: Role,
}

impl Caller {
    /// May use the admin API and the console (`role = "admin"`).
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// [`ErrorKind::Forbidden`] unless this caller may act for `tenant`.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), AppError> {
        match &self.tenants {
            Some(allowed) if !allowed.contains(tenant) => {
                Err(refused(AppError::forbidden(format!(
                    "token {:?} may not act for tenant {:?}; use a token bound to that tenant",
                    self.name,
                    tenant.chars().take(64).collect::<String>()
                ))))
            }
            _ => Ok(()),
        }
    }
}

/// May `caller` act for `tenant`? Without authentication (no caller),
/// anyone may.
pub fn check_tenant(caller: Option<&Caller>, tenant: &str) -> Result<(), AppError> {
    caller.map_or(Ok(()), |c| c.check_tenant(tenant))
}

/// `e`, counted as a refused caller.
fn refused(e: AppError) -> AppError {
    crate::telemetry::auth_refused(e.kind().code_name());
    e
}

/// A reload that would have turned authentication off: the current tokens
/// stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the reloaded configuration has no [auth] tokens; keeping the current ones \
     (authentication is turned off only by a restart)"
)]
pub struct KeptTokens;

/// The accepted tokens; empty means authentication is off.
#[derive(Default)]
pub struct Auth {
    tokens: RwLock<Arc<Vec<TokenSection>>>,
}

impl Auth {
    /// Accepts `tokens`.
    pub fn new(tokens: Vec<TokenSection>) -> Self {
        Auth {
            tokens: RwLock::new(Arc::new(tokens)),
        }
    }

    /// Replaces the accepted tokens (SIGHUP). A reload never turns
    /// authentication off: a file that lost its `[auth]` section (or all its
    /// tokens) keeps the current tokens, with an error logged; turning it off
    /// takes a restart.
    pub fn replace(&self, tokens: Vec<TokenSection>) -> Result<(), KeptTokens> {
        if tokens.is_empty() && self.enabled() {
            tracing::error!("{KeptTokens}");
            return Err(KeptTokens);
        }
        let names: Vec<&str> = tokens.iter().map(|t| t.name.as_str()).collect();
        tracing::info!(tokens = ?names, "reloaded caller tokens");
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
        Ok(())
    }

    fn tokens(&self) -> Arc<Vec<TokenSection>> {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// True when callers must authenticate.
    pub fn enabled(&self) -> bool {
        !self.tokens().is_empty()
    }

    /// True when some token has `role = "admin"`.
    pub fn has_admin(&self) -> bool {
        self.tokens().iter().any(|t| t.role == Role::Admin)
    }

    /// The caller behind an `authorization` header's value (`Bearer
    /// <token>`, gRPC metadata or HTTP), or [`ErrorKind::Unauthenticated`];
    /// `None` when authentication is off.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Option<Caller>, AppError> {
        let tokens = self.tokens();
        if tokens.is_empty() {
            return Ok(None);
        }
        let presented = header
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| {
                refused(AppError::new(
                    ErrorKind::Unauthenticated,
                    "missing bearer token: send the header (gRPC metadata) `authorization: \
                     Bearer <token>`",
                ))
            })?;
        // Compare with every token, in constant time, before deciding.
        let mut found = None;
        for t in tokens.iter() {
            if constant_time_eq(t.token.as_bytes(), presented.as_bytes()) {
                found = Some(t);
            }
        }
        match found {
            Some(t) => Ok(Some(Caller {
                name: t.name.clone(),
                tenants: t.tenants.clone(),
                role: t.role,
            })),
            None => Err(refused(AppError::new(
                ErrorKind::Unauthenticated,
                "invalid bearer token: it is not among the service's configured tokens",
            ))),
        }
    }

    /// The admin caller behind an `authorization` header's value (the admin
    /// API and the console): [`ErrorKind::Unauthenticated`] without a valid
    /// token, [`ErrorKind::Forbidden`] for a caller's token or when no admin
    /// token is configured at all.
    pub fn authenticate_admin(&self, header: Option<&str>) -> Result<Caller, AppError> {
        if !self.has_admin() {
            return Err(refused(AppError::forbidden(
                "the admin API and the console take an admin token, and none is configured: \
                 add [[auth.tokens]] with role = \"admin\" to the configuration file and send \
                 the service SIGHUP (docs/http-api.md#admin-api)",
            )));
        }
        match self.authenticate(header)? {
            Some(c) if c.is_admin() => Ok(c),
            Some(c) => Err(refused(AppError::forbidden(format!(
                "token {:?} is a caller's token; the admin API takes a token of role \"admin\"",
                c.name
            )))),
            None => Err(refused(AppError::new(
                ErrorKind::Unauthenticated,
                "missing bearer token: send the header `authorization: Bearer <admin token>`",
            ))),
        }
    }
}

/// Equality in time that depends only on the longer input's length: unlike a
/// slice `ct_eq`, no early return when the lengths differ, so a caller cannot
/// time its way to a token's length.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut equal = (a.len() as u64).ct_eq(&(b.len() as u64));
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        equal &= x.ct_eq(&y);
    }
    equal.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str, tenants: Option<&[&str]>) -> TokenSection {
        TokenSection {
            name: name.into(),
            token: secret.into(),
            token_file: None,
            tenants: tenants.map(|t| t.iter().map(|s| s.to_string()).collect()),
            role: Role::Caller,
        }
    }

    #[test]
    fn comparison_covers_every_byte_and_the_length() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(
            !constant_time_eq(b"abc", b"abc\0"),
            "zero padding is not equality"
        );
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn old_and_new_tokens_work_others_do_not() {
        let auth = Auth::new(vec![
            token("old", "s1", None),
            token("new", "s2", Some(&["acme"])),
        ]);
        assert_eq!(
            auth.authenticate(Some("Bearer s1")).unwrap().unwrap().name,
            "old"
        );
        let new = auth.authenticate(Some("Bearer s2")).unwrap().unwrap();
        assert!(new.check_tenant("acme").is_ok());
        assert_eq!(
            new.check_tenant("globex").unwrap_err().kind(),
            ErrorKind::Forbidden
        );
        for bad in [None, Some("Bearer nope"), Some("s1"), Some("Basic s1")] {
            let err = auth.authenticate(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{bad:?}");
            assert!(!err.message().contains("s1") && !err.message().contains("s2"));
        }
        assert!(format!("{:?}", token("x", "secret", None)).contains("redacted"));
        assert!(Auth::default().authenticate(None).unwrap().is_none(), "off");
    }

    #[test]
    fn the_admin_api_takes_only_admin_tokens() {
        let caller_only = Auth::new(vec![token("gw", "s1", None)]);
        let e = caller_only
            .authenticate_admin(Some("Bearer s1"))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Forbidden);
        assert!(e.message().contains("none is configured"), "{e}");
        let mut admin = token("ops", "s2", None);
        admin.role = Role::Admin;
        let auth = Auth::new(vec![token("gw", "s1", None), admin]);
        assert_eq!(
            auth.authenticate_admin(Some("Bearer s1"))
                .unwrap_err()
                .kind(),
            ErrorKind::Forbidden
        );
        assert_eq!(
            auth.authenticate_admin(None).unwrap_err().kind(),
            ErrorKind::Unauthenticated
        );
        assert_eq!(
            auth.authenticate_admin(Some("Bearer s2")).unwrap().name,
            "ops"
        );
    }
}
