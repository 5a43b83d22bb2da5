//! Redis errors as store errors: which failures are transient, which mean the
//! call may have been applied, which mean the settings are wrong; and URLs with
//! their passwords hidden.

use crate::store::{Detail, StoreError};
use redis::RedisError;
use std::sync::Arc;

pub(super) fn pool_error(e: deadpool_redis::PoolError) -> RedisError {
    match e {
        deadpool_redis::PoolError::Backend(e) => e,
        other => RedisError::from(std::io::Error::other(other.to_string())),
    }
}

fn unavailable(url: &str, e: RedisError) -> StoreError {
    StoreError::Unavailable(caused(url, e))
}

/// `url: error`, caused by the error.
fn caused(url: &str, e: RedisError) -> Detail {
    Detail::caused_by(format!("{url}: {e}"), e)
}

/// How a Redis error becomes a store error.
pub(super) type Classify = fn(&str, RedisError) -> StoreError;

/// For the start-up checks: "not there (yet)" is transient — any network
/// failure (refused, timed out, dropped, a name that does not resolve yet, no
/// route), or Redis still loading; Redis refusing the service (a wrong
/// password, a TLS handshake it rejects, a command it does not know) means the
/// settings are wrong.
pub(super) fn classify_answered(url: &str, e: RedisError) -> StoreError {
    use std::io::ErrorKind;
    // A TLS failure surfaces as a rustls error, or an I/O error of kind
    // InvalidData, somewhere in the error's chain.
    let mut tls_refused = false;
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        // redis-rs keeps its cause in an Arc: look inside it too.
        let io = s.downcast_ref::<std::io::Error>().or_else(|| {
            s.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()
                .and_then(|b| b.downcast_ref::<std::io::Error>())
        });
        tls_refused |= s.is::<rustls::Error>()
            || io.is_some_and(|io| {
                matches!(io.kind(), ErrorKind::InvalidData | ErrorKind::InvalidInput)
            });
        source = s.source();
    }
    let not_there = (e.is_io_error() && !tls_refused)
        || e.is_timeout()
        || e.is_connection_dropped()
        || matches!(
            e.code(),
            Some("LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
        );
    if not_there {
        unavailable(url, e)
    } else {
        StoreError::Settings(Detail::caused_by(
            format!("{url} refused the service: {e}"),
            e,
        ))
    }
}

/// Transient failures are `Unanswered` when the call may have reached Redis
/// (a timeout, a dropped connection) and `Unavailable` when it cannot have
/// (refused, or Redis answered with an error: loading, out of memory…);
/// anything else means foreign data or a bug.
pub(super) fn classify(url: &str, e: RedisError) -> StoreError {
    if e.is_io_error() && !e.is_connection_refusal() {
        return StoreError::Unanswered(caused(url, e));
    }
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.code(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "OOM"
                    | "MASTERDOWN"
                    | "TRYAGAIN"
                    | "CLUSTERDOWN"
                    | "READONLY"
                    // A cluster's slots moving (a failover): the client
                    // follows, and a call it gave up on is retried.
                    | "MOVED"
                    | "ASK"
                    | "NOAUTH"
                    | "WRONGPASS"
                    | "MISCONF"
            )
        );
    if transient {
        unavailable(url, e)
    } else {
        StoreError::Protocol(caused(url, e))
    }
}

/// The URL with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsable redis url>".into();
    };
    match rest.rsplit_once('@') {
        Some((auth, host)) => {
            let user = auth.split_once(':').map_or("", |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{classify_answered, redact_url};
    use crate::store::StoreError;
    use redis::RedisError;
    use std::io::{Error, ErrorKind};

    #[test]
    fn at_start_up_only_a_refusal_is_a_settings_error() {
        let io = |kind, what: &str| RedisError::from(Error::new(kind, what.to_string()));
        for absent in [
            io(ErrorKind::ConnectionRefused, "connection refused"),
            io(ErrorKind::Other, "failed to lookup address information"),
            io(ErrorKind::HostUnreachable, "no route to host"),
            io(ErrorKind::TimedOut, "timed out"),
        ] {
            let e = classify_answered("redis://h:1", absent);
            assert!(matches!(e, StoreError::Unavailable(_)), "transient: {e}");
        }
        let tls = io(
            ErrorKind::InvalidData,
            "received fatal alert: CertificateRequired",
        );
        let e = classify_answered("redis://h:1", tls);
        assert!(matches!(e, StoreError::Settings(_)), "TLS refused: {e}");
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "wrong password"));
        let e = classify_answered("redis://h:1", auth);
        assert!(matches!(e, StoreError::Settings(_)), "auth refused: {e}");
    }

    #[test]
    fn passwords_never_reach_logs() {
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(redact_url("rediss://app:p@ss@h:1"), "rediss://app:***@h:1");
        assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    }
}
