//! Reading the usage ledger: a tenant's rows of given hours or days (a
//! pipeline of `HGETALL`s), and every tenant holding rows (`SCAN`, for the
//! reconciliation across tenants). The scripts write it (`lua/ledger.lua`).

use super::RedisStore;
use super::endpoint::cluster_masters;
use crate::domain::TenantId;
use crate::domain::budget::ledger::{LedgerRow, Period, Row};
use crate::store::StoreError;
use crate::store::keys::ledger_row;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

/// Periods per pipeline: a long range is read in several round trips, each
/// well inside the store deadline.
const PER_PIPELINE: usize = 256;

impl RedisStore {
    /// `tenant`'s rows of each period, by group then user (a field this
    /// layout does not make is skipped).
    pub(super) async fn ledger_call(
        &self,
        tenant: &TenantId,
        periods: &[Period],
    ) -> Result<Vec<Vec<LedgerRow>>, StoreError> {
        let mut out = Vec::with_capacity(periods.len());
        for chunk in periods.chunks(PER_PIPELINE) {
            let mut pipe = redis::pipe();
            for p in chunk {
                pipe.cmd("HGETALL").arg(self.keys.ledger(tenant, *p));
            }
            let hashes: Vec<Vec<(String, Vec<u8>)>> = self.query(&pipe).await?;
            for (p, fields) in chunk.iter().zip(hashes) {
                let rows: Vec<(String, Row)> = fields
                    .into_iter()
                    .map(|(field, bytes)| match Row::decode(&bytes) {
                        Some(row) => Ok((field, row)),
                        None => Err(StoreError::Protocol(
                            format!(
                                "ledger row {field:?} of {} is {} bytes, not a row",
                                self.keys.ledger(tenant, *p),
                                bytes.len()
                            )
                            .into(),
                        )),
                    })
                    .collect::<Result<_, _>>()?;
                let mut rows: Vec<LedgerRow> = rows
                    .into_iter()
                    .filter_map(|(f, r)| ledger_row(*p, &f, r))
                    .collect();
                rows.sort_by(|a, b| (&a.group, &a.user).cmp(&(&b.group, &b.user)));
                out.push(rows);
            }
        }
        Ok(out)
    }

    /// Every tenant with hourly (or daily) ledger rows, and which periods
    /// (on a cluster, SCAN runs on every master).
    pub(super) async fn ledger_keys_call(
        &self,
        hourly: bool,
    ) -> Result<Vec<(TenantId, Period)>, StoreError> {
        let keys = self.scan_keys(&self.keys.ledger_pattern(hourly)).await?;
        let mut out: Vec<(TenantId, Period)> = keys
            .iter()
            .filter_map(|k| self.keys.parse_ledger(k))
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Every key matching `pattern` (on a cluster, SCAN runs on every master).
    pub(super) async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let scan = |cursor: u64| {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            scan
        };
        let mut out = Vec::new();
        match self.connections.cluster_connection() {
            None => {
                self.scan_pages(&mut out, |cursor| async move {
                    let mut pipe = redis::pipe();
                    pipe.add_command(scan(cursor));
                    let (page,): ((u64, Vec<String>),) = self.query(&pipe).await?;
                    Ok(page)
                })
                .await?
            }
            Some(mut conn) => {
                let err = |e: redis::RedisError| {
                    StoreError::Unavailable(format!("{}: {e}", self.url).into())
                };
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut conn)
                    .await
                    .map_err(err)?;
                for (host, port) in cluster_masters(&nodes) {
                    let conn = &conn;
                    let host = &host;
                    self.scan_pages(&mut out, |cursor| async move {
                        let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        let mut conn = conn.clone();
                        let call = conn.route_command(scan(cursor), route);
                        let reply = tokio::time::timeout(self.timeout, call)
                            .await
                            .map_err(|_| {
                                StoreError::Unanswered(
                                    format!("{host}:{port}: SCAN timed out").into(),
                                )
                            })?
                            .map_err(err)?;
                        redis::from_redis_value(reply).map_err(|e| {
                            StoreError::Protocol(format!("{host}:{port}: SCAN: {e}").into())
                        })
                    })
                    .await?;
                }
            }
        }
        Ok(out)
    }

    /// Runs SCAN pages (`page(cursor)` → next cursor, keys) to the end,
    /// adding the keys found to `out`.
    async fn scan_pages<F, Fut>(&self, out: &mut Vec<String>, mut page: F) -> Result<(), StoreError>
    where
        F: FnMut(u64) -> Fut,
        Fut: std::future::Future<Output = Result<(u64, Vec<String>), StoreError>>,
    {
        let mut cursor = 0u64;
        loop {
            let (next, keys) = page(cursor).await?;
            out.extend(keys);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}
