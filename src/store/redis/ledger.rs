//! Reading the usage ledger: a tenant's rows of given hours or days (a
//! pipeline of `HGETALL`s), and every tenant holding rows (`SCAN`, for the
//! reconciliation across tenants). The scripts write it (`lua/ledger.lua`).

use super::RedisStore;
use crate::domain::TenantId;
use crate::domain::budget::ledger::{LedgerRow, Period, Row};
use crate::store::StoreError;
use crate::store::keys::ledger_row;

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

    /// Every tenant with hourly (or daily) ledger rows, and which periods.
    pub async fn ledger_keys(&self, hourly: bool) -> Result<Vec<(TenantId, Period)>, StoreError> {
        let pattern = self.keys.ledger_pattern(hourly);
        let mut cursor = 0u64;
        let mut out = Vec::new();
        loop {
            let mut pipe = redis::pipe();
            pipe.cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let ((next, keys),): ((u64, Vec<String>),) = self.query(&pipe).await?;
            out.extend(keys.iter().filter_map(|k| self.keys.parse_ledger(k)));
            if next == 0 {
                break;
            }
            cursor = next;
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}
