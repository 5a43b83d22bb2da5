//! Caller authentication: bearer tokens in the `authorization` metadata,
//! compared in constant time. Tokens are a set, so during a rotation the new
//! token and the previous one both work; SIGHUP reloads them. A token may be
//! bound to tenants: a caller naming another tenant — or settling another
//! tenant's reservation — gets PERMISSION_DENIED. An unauthenticated call gets
//! UNAUTHENTICATED and touches nothing. Tokens never reach a log.

use super::errors::{Refusal, refusal_status};
pub use crate::config::{MIN_TOKEN_LEN, Role, TokenSection};
use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

/// Who is calling, once authenticated; handlers check tenants against it.
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

    /// PERMISSION_DENIED unless this caller may act for `tenant`.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), Status> {
        match &self.tenants {
            Some(allowed) if !allowed.contains(tenant) => {
                Err(refusal_status(Refusal::PermissionDenied(format!(
                    "token {:?} may not act for tenant {:?}; use a token bound to that tenant",
                    self.name,
                    tenant.chars().take(64).collect::<String>()
                ))))
            }
            _ => Ok(()),
        }
    }
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

    /// True when callers must authenticate.
    pub fn enabled(&self) -> bool {
        !self
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// True when some token has `role = "admin"`.
    pub fn has_admin(&self) -> bool {
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|t| t.role == Role::Admin)
    }

    /// The caller behind `request`'s bearer token, or UNAUTHENTICATED.
    pub fn authenticate<T>(&self, request: &Request<T>) -> Result<Option<Caller>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.authenticate_header(header)
    }

    /// The caller behind an `authorization` header's value (`Bearer <token>`),
    /// or UNAUTHENTICATED; `None` when authentication is off.
    pub fn authenticate_header(&self, header: Option<&str>) -> Result<Option<Caller>, Status> {
        let tokens = self
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if tokens.is_empty() {
            return Ok(None);
        }
        let presented = header
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| {
                refusal_status(Refusal::Unauthenticated(
                    "missing bearer token: send the header (gRPC metadata) `authorization: Bearer <token>`",
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
            None => Err(refusal_status(Refusal::Unauthenticated(
                "invalid bearer token: it is not among the service's configured tokens",
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

/// The gRPC interceptor in front of BudgetService: it runs on the headers,
/// before the body is decoded, so an unauthenticated call is refused
/// UNAUTHENTICATED whatever its body, and touches nothing. The caller it finds
/// goes into the request's extensions for the tenant checks.
pub fn interceptor(
    auth: Arc<Auth>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone + Send + Sync + 'static {
    move |mut request: Request<()>| match auth.authenticate(&request) {
        Ok(Some(caller)) => {
            request.extensions_mut().insert(caller);
            Ok(request)
        }
        Ok(None) => Ok(request),
        Err(status) => {
            crate::telemetry::auth_refused(status.code());
            Err(status)
        }
    }
}

/// May the caller of `request` (put there by [`interceptor`]) act for
/// `tenant`? Without authentication, anyone may.
pub fn check_tenant<T>(request: &Request<T>, tenant: &str) -> Result<(), Status> {
    match request.extensions().get::<Caller>() {
        Some(caller) => caller.check_tenant(tenant).inspect_err(|status| {
            crate::telemetry::auth_refused(status.code());
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str, tenants: Option<&[&str]>) -> TokenSection {
        TokenSection {
            name: name.into(),
            token: secret.into(),
            tenants: tenants.map(|t| t.iter().map(|s| s.to_string()).collect()),
            role: Role::Caller,
        }
    }

    fn request(auth: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(a) = auth {
            r.metadata_mut().insert("authorization", a.parse().unwrap());
        }
        r
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
            auth.authenticate(&request(Some("Bearer s1")))
                .unwrap()
                .unwrap()
                .name,
            "old"
        );
        let new = auth
            .authenticate(&request(Some("Bearer s2")))
            .unwrap()
            .unwrap();
        assert!(new.check_tenant("acme").is_ok());
        assert_eq!(
            new.check_tenant("globex").unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        for bad in [None, Some("Bearer nope"), Some("s1"), Some("Basic s1")] {
            let err = auth.authenticate(&request(bad)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{bad:?}");
            assert!(!err.message().contains("s1") && !err.message().contains("s2"));
        }
        assert!(format!("{:?}", token("x", "secret", None)).contains("redacted"));
        assert!(
            Auth::default()
                .authenticate(&request(None))
                .unwrap()
                .is_none(),
            "off"
        );
    }
}
