//! `[server]`'s settings beyond the listen address: the listener's TLS files
//! and admission under overload, each checked against its range.

use super::ServerSection;
use super::input::within;
use crate::domain::LimitsError;
use std::path::PathBuf;
use std::time::Duration;

/// The PEM files of the gRPC listener's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA that signs client certificates; set: mutual TLS.
    pub client_ca: Option<PathBuf>,
}

/// The listener's TLS files: none, or a certificate with its key (and a
/// client CA for mutual TLS).
pub(super) fn tls_files(server: &ServerSection) -> Result<Option<TlsFiles>, LimitsError> {
    match (&server.tls_cert, &server.tls_key, &server.tls_client_ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), client_ca) => Ok(Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: client_ca.clone(),
        })),
        _ => Err(LimitsError::new(
            "server.tls_cert",
            "TLS needs both tls_cert and tls_key (tls_client_ca adds mutual TLS on top)",
        )),
    }
}

/// Admission under overload (`[server] max_in_flight`, `queue_ms`,
/// `shed_retry_ms`, `max_concurrent_streams`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// Budget and Envoy calls worked on at once.
    pub max_in_flight: usize,
    /// How long a call waits for a slot before it is shed.
    pub queue: Duration,
    /// The retry hint of a shed call, ms.
    pub retry_ms: u64,
    /// HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
}

/// `[server]`'s admission settings, each checked against its range.
pub(super) fn admission(server: &ServerSection) -> Result<AdmissionSettings, LimitsError> {
    within(
        "server.max_in_flight",
        server.max_in_flight as u64,
        1,
        1_000_000,
    )?;
    within("server.queue_ms", server.queue_ms, 0, 60_000)?;
    within("server.shed_retry_ms", server.shed_retry_ms, 1, 3_600_000)?;
    within(
        "server.max_concurrent_streams",
        u64::from(server.max_concurrent_streams),
        1,
        1_000_000,
    )?;
    Ok(AdmissionSettings {
        max_in_flight: server.max_in_flight,
        queue: Duration::from_millis(server.queue_ms),
        retry_ms: server.shed_retry_ms,
        max_concurrent_streams: server.max_concurrent_streams,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{FileConfig, Flags};

    #[test]
    fn the_http_listener_is_off_unless_the_file_or_a_flag_sets_it() {
        let settings = |file: &str, flag: Option<&str>| {
            let file = FileConfig::parse(file, "t.toml").unwrap();
            let flags = Flags {
                http_listen: flag.map(|f| f.parse().unwrap()),
                ..Flags::default()
            };
            FileConfig::built_in().overlay(file).settings(flags)
        };
        assert_eq!(settings("", None).unwrap().http_listen, None);
        let on = "[http]\nlisten = \"127.0.0.1:8080\"\n";
        assert_eq!(
            settings(on, None).unwrap().http_listen,
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            settings(on, Some("127.0.0.1:9090")).unwrap().http_listen,
            Some("127.0.0.1:9090".parse().unwrap()),
            "the flag wins"
        );
        let admin_bound = "[[auth.tokens]]\nname = \"ops\"\ntoken = \"0123456789abcdef0123\"\n\
                           role = \"admin\"\ntenants = [\"acme\"]\n";
        let err = settings(admin_bound, None).unwrap_err().to_string();
        assert!(
            err.contains("auth.tokens[0].tenants") && err.contains("admin"),
            "{err}"
        );
    }
}
