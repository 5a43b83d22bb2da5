//! Opening a Redis client: the URL, with TCP_NODELAY, and for `rediss://` the
//! certificates beyond the public roots. Every failure here is a settings
//! error, never a transient one: a malformed URL, TLS files that cannot be
//! read or parsed, or TLS files for a URL that is not `rediss://`. (A client
//! certificate whose key does not match is found when the first connection is
//! made, and is a settings error there too: see `errors::classify_answered`.)

use super::redact_url;
use crate::store::{Detail, StoreError};
use redis::IntoConnectionInfo;
use std::path::{Path, PathBuf};

/// PEM files for `rediss://`: a private CA, and a client certificate when
/// Redis requires one (`tls-auth-clients yes`). Without them, `rediss://`
/// trusts the public (webpki) roots.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct RedisTls {
    /// CA that signed Redis's certificate.
    pub ca: Option<PathBuf>,
    /// Client certificate.
    pub cert: Option<PathBuf>,
    /// Its private key.
    pub key: Option<PathBuf>,
}

impl RedisTls {
    /// No TLS files: plain `redis://`, or `rediss://` on the public roots.
    pub(super) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

/// A client for `url` with TCP_NODELAY and `tls`'s certificates. Errors name
/// the URL with its password hidden.
pub fn open_client(url: &str, tls: &RedisTls) -> Result<redis::Client, StoreError> {
    let shown = redact_url(url);
    let invalid = |e: redis::RedisError| {
        StoreError::Settings(Detail::caused_by(
            format!("invalid Redis URL {shown}: {e}"),
            e,
        ))
    };
    // TCP_NODELAY: redis-rs leaves Nagle on, and pipelined calls then stall
    // on delayed ACKs (tens of ms at p99 under light load).
    let info = url.into_connection_info().map_err(invalid)?;
    let nodelay = info.tcp_settings().clone().set_nodelay(true);
    let info = info.set_tcp_settings(nodelay);
    if tls.is_empty() {
        return redis::Client::open(info).map_err(invalid);
    }
    if !url.starts_with("rediss://") {
        return Err(StoreError::Settings(
            format!("TLS files are configured but {shown} is not a rediss:// URL").into(),
        ));
    }
    let certificates = redis::TlsCertificates {
        client_tls: client_certificate(tls)?,
        root_cert: tls.ca.as_deref().map(|ca| read_pem("CA", ca)).transpose()?,
    };
    redis::Client::build_with_tls(info, certificates).map_err(|e| {
        StoreError::Settings(Detail::caused_by(format!("{shown}: TLS set-up: {e}"), e))
    })
}

/// A client for the Redis Cluster whose seed nodes are `nodes`, with
/// TCP_NODELAY and `tls`'s certificates. Auth comes from the node URLs (every
/// node of a cluster shares it). Errors name the nodes with passwords hidden.
pub fn open_cluster_client(
    nodes: &[String],
    tls: &RedisTls,
) -> Result<redis::cluster::ClusterClient, StoreError> {
    let shown: Vec<String> = nodes.iter().map(|n| redact_url(n)).collect();
    let shown = shown.join(",");
    let mut infos = Vec::with_capacity(nodes.len());
    for node in nodes {
        let info = node.as_str().into_connection_info().map_err(|e| {
            StoreError::Settings(Detail::caused_by(
                format!("invalid Redis Cluster node URL {}: {e}", redact_url(node)),
                e,
            ))
        })?;
        infos.push(info);
    }
    let secure = nodes.iter().filter(|n| n.starts_with("rediss://")).count();
    if secure != 0 && secure != nodes.len() {
        return Err(StoreError::Settings(
            format!("Redis Cluster nodes {shown} mix redis:// and rediss://: use one").into(),
        ));
    }
    if !tls.is_empty() && secure == 0 {
        return Err(StoreError::Settings(
            format!(
                "TLS files are configured but the cluster nodes {shown} are not rediss:// URLs"
            )
            .into(),
        ));
    }
    let nodelay = redis::io::tcp::TcpSettings::default().set_nodelay(true);
    let mut builder = redis::cluster::ClusterClientBuilder::new(infos)
        .tcp_settings(nodelay)
        // A failover takes the cluster's node timeout and more: the store
        // deadline cuts a call, and the breaker and failure policy answer.
        .retries(2)
        .min_retry_wait(10)
        .max_retry_wait(200);
    if !tls.is_empty() {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: client_certificate(tls)?,
            root_cert: tls.ca.as_deref().map(|ca| read_pem("CA", ca)).transpose()?,
        });
    }
    builder.build().map_err(|e| {
        StoreError::Settings(Detail::caused_by(
            format!("Redis Cluster nodes {shown}: {e}"),
            e,
        ))
    })
}

/// The client certificate and key, when both are configured.
fn client_certificate(tls: &RedisTls) -> Result<Option<redis::ClientTlsConfig>, StoreError> {
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => Ok(Some(redis::ClientTlsConfig {
            client_cert: read_pem("certificate", cert)?,
            client_key: read_pem("key", key)?,
        })),
        (None, None) => Ok(None),
        _ => Err(StoreError::Settings(
            "a Redis client certificate needs both tls_cert and tls_key".into(),
        )),
    }
}

/// The bytes of one TLS file; `what` names it in the error.
fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        StoreError::Settings(Detail::caused_by(
            format!("cannot read the Redis TLS {what} {}: {e}", path.display()),
            e,
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::{RedisTls, open_client};
    use crate::store::StoreError;
    use std::error::Error as _;

    /// A settings error, never transient, with its cause attached.
    fn settings_error(result: Result<redis::Client, StoreError>) -> StoreError {
        let e = result.expect_err("refused");
        assert!(matches!(e, StoreError::Settings(_)), "{e}");
        assert!(!e.is_transient(), "{e}");
        e
    }

    #[test]
    fn a_malformed_url_is_a_settings_error_caused_by_the_parse() {
        let e = settings_error(open_client(
            "redis://:s3cret@127.0.0.1:notaport/0",
            &RedisTls::default(),
        ));
        assert!(e.to_string().contains("invalid Redis URL"), "{e}");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let cause = e.source().expect("a cause");
        assert!(cause.is::<redis::RedisError>(), "{cause:?}");
    }

    #[test]
    fn an_unreadable_tls_file_is_a_settings_error_caused_by_the_read() {
        let tls = RedisTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..RedisTls::default()
        };
        let e = settings_error(open_client("rediss://127.0.0.1:1/0", &tls));
        assert!(
            e.to_string().contains("cannot read the Redis TLS CA"),
            "{e}"
        );
        let io = e.source().and_then(|c| c.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn tls_files_that_do_not_go_together_are_settings_errors() {
        let half = RedisTls {
            cert: Some("/nonexistent/client.pem".into()),
            ..RedisTls::default()
        };
        settings_error(open_client("rediss://127.0.0.1:1/0", &half));
        let ca = RedisTls {
            ca: Some("/nonexistent/ca.pem".into()),
            ..RedisTls::default()
        };
        settings_error(open_client("redis://127.0.0.1:1/0", &ca));
        let garbage = std::env::temp_dir().join(format!("ctxb-garbage-{}.pem", std::process::id()));
        std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
        let bad = RedisTls {
            ca: Some(garbage.clone()),
            ..RedisTls::default()
        };
        let e = settings_error(open_client("rediss://127.0.0.1:1/0", &bad));
        assert!(e.source().is_some(), "{e}");
        let _ = std::fs::remove_file(garbage);
    }
}
