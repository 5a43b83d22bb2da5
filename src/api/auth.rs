//! Caller authentication: bearer tokens in the `authorization` metadata,
//! compared in constant time. Tokens are a set, so during a rotation the new
//! token and the previous one both work; SIGHUP reloads them. A token may be
//! bound to tenants: a caller naming another tenant — or settling another
//! tenant's reservation — gets PERMISSION_DENIED. An unauthenticated call gets
//! UNAUTHENTICATED and touches nothing. Tokens never reach a log.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

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
}

impl std::fmt::Debug for TokenSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSection")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("tenants", &self.tenants)
            .finish()
    }
}

/// Shortest token accepted: anything shorter can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// Checks configured tokens: names and secrets unique, secrets long enough,
/// printable and without spaces (they travel in an HTTP/2 header), tenant
/// sets not empty. On error: the field suffix (`[i].token`) and the problem —
/// which never quotes a secret.
pub fn validate(tokens: &[TokenSection]) -> Result<(), (String, String)> {
    for (i, t) in tokens.iter().enumerate() {
        let at = |field: &str| format!("[{i}].{field}");
        if t.name.trim().is_empty() {
            return Err((at("name"), "must not be empty".into()));
        }
        if t.token.len() < MIN_TOKEN_LEN {
            return Err((
                at("token"),
                format!(
                    "token {:?} is shorter than {MIN_TOKEN_LEN} characters; generate one with \
                     `openssl rand -hex 32`",
                    t.name
                ),
            ));
        }
        if !t.token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err((
                at("token"),
                format!("token {:?} must be printable ASCII without spaces", t.name),
            ));
        }
        if matches!(&t.tenants, Some(set) if set.is_empty()) {
            return Err((
                at("tenants"),
                format!(
                    "token {:?} is bound to no tenant: list tenants, or drop `tenants` to allow all",
                    t.name
                ),
            ));
        }
        for earlier in &tokens[..i] {
            if earlier.name == t.name {
                return Err((at("name"), format!("token name {:?} appears twice", t.name)));
            }
            if earlier.token == t.token {
                return Err((
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

/// Who is calling, once authenticated; handlers check tenants against it.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    tenants: Option<BTreeSet<String>>,
}

impl Caller {
    /// PERMISSION_DENIED unless this caller may act for `tenant`.
    pub fn check_tenant(&self, tenant: &str) -> Result<(), Status> {
        match &self.tenants {
            Some(allowed) if !allowed.contains(tenant) => Err(Status::permission_denied(format!(
                "token {:?} may not act for tenant {:?}; use a token bound to that tenant",
                self.name,
                tenant.chars().take(64).collect::<String>()
            ))),
            _ => Ok(()),
        }
    }
}

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

    /// Replaces the accepted tokens (SIGHUP).
    pub fn replace(&self, tokens: Vec<TokenSection>) {
        let names: Vec<&str> = tokens.iter().map(|t| t.name.as_str()).collect();
        tracing::info!(tokens = ?names, "reloaded caller tokens");
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
    }

    /// True when callers must authenticate.
    pub fn enabled(&self) -> bool {
        !self
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// The caller behind `request`'s bearer token, or UNAUTHENTICATED.
    pub fn authenticate<T>(&self, request: &Request<T>) -> Result<Option<Caller>, Status> {
        let tokens = self
            .tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if tokens.is_empty() {
            return Ok(None);
        }
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| {
                Status::unauthenticated(
                    "missing bearer token: send the metadata `authorization: Bearer <token>`",
                )
            })?;
        // Compare with every token, in constant time, before deciding.
        let mut found = None;
        for t in tokens.iter() {
            if bool::from(t.token.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(t);
            }
        }
        match found {
            Some(t) => Ok(Some(Caller {
                name: t.name.clone(),
                tenants: t.tenants.clone(),
            })),
            None => Err(Status::unauthenticated(
                "invalid bearer token: it is not among the service's configured tokens",
            )),
        }
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
