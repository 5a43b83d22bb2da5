//! The POST of one event to the receiver: the JSON body, signed
//! (`x-ctxbudget-signature: sha256=<hex HMAC-SHA256 of the body>` with the
//! secret) and named (`x-ctxbudget-event-id`, the same on every try).

use super::event::Event;
use std::time::Duration;

/// The signature header.
pub const SIGNATURE: &str = "x-ctxbudget-signature";
/// The event id header.
pub const EVENT_ID: &str = "x-ctxbudget-event-id";

/// Why a POST did not deliver.
#[derive(Debug, thiserror::Error)]
pub enum Undelivered {
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// No connection.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// An answer other than 2xx.
    #[error("the receiver answered HTTP {0}")]
    Status(u16),
}

impl Undelivered {
    /// The metric's `reason` label.
    pub fn reason(&self) -> &'static str {
        match self {
            Undelivered::Timeout(_) => "timeout",
            Undelivered::Connect(_) => "connect",
            Undelivered::Status(_) => "status",
        }
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `body` under `secret`.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = ring::hmac::sign(&key, body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// Posts `event` to `url`, signed with `secret` when there is one; 2xx is
/// delivered.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    secret: Option<&str>,
    timeout: Duration,
    event: &Event,
) -> Result<(), Undelivered> {
    let body = serde_json::to_vec(event).unwrap_or_default();
    let mut req = client
        .post(url)
        .timeout(timeout)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(EVENT_ID, &event.event_id);
    if let Some(secret) = secret {
        req = req.header(SIGNATURE, signature(secret, &body));
    }
    match req.body(body).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(Undelivered::Status(r.status().as_u16())),
        Err(e) if e.is_timeout() => Err(Undelivered::Timeout(timeout)),
        Err(e) => Err(Undelivered::Connect(e.to_string())),
    }
}

/// The client every POST shares (connections are kept between alerts).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("ctxbudget/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_signature_is_rfc_4231s_hmac_sha256() {
        // RFC 4231, test case 2.
        assert_eq!(
            super::signature("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
