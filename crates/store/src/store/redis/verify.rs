//! The checks a store passes once before it serves: every connection answers,
//! Redis is 7.0 or newer, the scripts are loaded. Until they pass the store is
//! not [`RedisStore::reachable`], and the breaker's probe runs them again.
//! Redis answering with a refusal (a wrong password, a TLS handshake it
//! rejects) is a settings error here, not an outage; each step is bounded.

use super::RedisStore;
use super::errors::{Classify, classify, classify_answered};
use crate::store::StoreError;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl RedisStore {
    /// Whether Redis has answered the version check and loaded the scripts.
    pub fn reachable(&self) -> bool {
        self.verified.load(Ordering::Relaxed)
    }

    /// The breaker's probe: PINGs every connection, or, while the store has
    /// not yet passed its checks (Redis was unreachable at start-up), runs them.
    pub(super) async fn probe_now(&self) -> Result<(), StoreError> {
        match self.reachable() {
            true => {
                self.connections
                    .ping_all(&self.url, self.timeout, classify)
                    .await
            }
            // A store that was unreachable at start-up is checked now.
            false => self.verify().await,
        }
    }

    /// The version check and script load, once per store.
    pub(super) async fn verify(&self) -> Result<(), StoreError> {
        if self.reachable() {
            return Ok(());
        }
        self.connections
            .ping_all(&self.url, self.timeout, classify_answered)
            .await?;
        let within = self.timeout.max(Duration::from_secs(1));
        tokio::time::timeout(within, self.check_version(classify_answered))
            .await
            .map_err(|_| {
                StoreError::Unavailable(
                    format!(
                        "{} did not answer INFO within {} ms",
                        self.url,
                        within.as_millis()
                    )
                    .into(),
                )
            })??;
        self.load_scripts(classify_answered).await?;
        self.verified.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The scripts declare flags with a `#!lua` line, which Redis understands
    /// from 7.0 on; an older server is refused with a clear message.
    async fn check_version(&self, classify: Classify) -> Result<(), StoreError> {
        let mut conn = self
            .connections
            .first()
            .await
            .map_err(|e| classify(&self.url, e))?;
        // One reply from a single Redis; one per node (a map) from a cluster.
        let reply: redis::Value = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .map_err(|e| classify(&self.url, e))?;
        let mut infos = Vec::new();
        info_texts(reply, &mut infos);
        let oldest = infos.iter().map(|i| redis_version(i)).min_by_key(|v| v.1);
        let (version, major) = oldest.unwrap_or(("unknown", 0));
        if major < 7 {
            return Err(StoreError::Protocol(
                format!(
                    "{} runs Redis {version}; ctxbudget needs Redis 7.0 or newer",
                    self.url
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// Loads every script (startup, and a cheap readiness probe).
    async fn load_scripts(&self, classify: Classify) -> Result<(), StoreError> {
        for script in [
            &self.reserve,
            &self.reserve_first,
            &self.settle,
            &self.renew,
            &self.status,
            &self.charge,
            &self.global_lease,
        ] {
            let load = async {
                let mut conn = self.connections.first().await?;
                script.prepare_invoke().load_async(&mut conn).await
            };
            tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), load)
                .await
                .map_err(|_| {
                    StoreError::Unavailable(
                        format!("{}: loading scripts timed out", self.url).into(),
                    )
                })?
                .map_err(|e| classify(&self.url, e))?;
        }
        Ok(())
    }
}

/// Every text in an INFO reply: one for a single Redis, one per node of a
/// cluster (whose reply maps each node to its text).
fn info_texts(reply: redis::Value, out: &mut Vec<String>) {
    match reply {
        redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
        redis::Value::SimpleString(s) | redis::Value::VerbatimString { text: s, .. } => out.push(s),
        redis::Value::Map(pairs) => pairs.into_iter().for_each(|(_, v)| info_texts(v, out)),
        redis::Value::Array(items) => items.into_iter().for_each(|v| info_texts(v, out)),
        _ => {}
    }
}

/// The version in `INFO server` (`unknown` when missing) and its major number
/// (0 when unreadable).
fn redis_version(info: &str) -> (&str, u32) {
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(str::trim)
        .unwrap_or("unknown");
    let major = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    (version, major)
}

#[cfg(test)]
mod tests {
    use super::redis_version;

    #[test]
    fn versions_are_read_from_info() {
        let info = "# Server\r\nredis_version:7.2.4\r\nredis_mode:standalone\r\n";
        assert_eq!(redis_version(info), ("7.2.4", 7));
        assert_eq!(redis_version("# Server\r\n"), ("unknown", 0));
    }
}
