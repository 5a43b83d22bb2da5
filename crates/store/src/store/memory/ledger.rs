//! The memory store's usage ledger: `lua/ledger.lua`'s row update and the
//! reads, on the store's map of ledger hashes.

use super::{Data, MemoryStore};
use crate::domain::budget::ledger::{Entry, LedgerRow, Period};
use crate::domain::layout::LEDGER_MIN_LIFE_US;
use crate::domain::{Clock, ReservationId, TenantId};
use crate::store::keys::{TenantKeys, ledger_fields, ledger_row};

impl<C: Clock> MemoryStore<C> {
    /// ledger.lua: adds `entry` to the hourly and daily rows of `id`'s
    /// tenant; a row's hash gets its expiry when the row is new, and a row
    /// past its retention is not written.
    pub(super) fn enter(
        &self,
        d: &mut Data,
        tenant: &TenantKeys<'_>,
        id: &ReservationId,
        entry: Entry,
        now: i64,
    ) {
        let Some(retention) = self.retention.ledger else {
            return;
        };
        let (hour, day) = Period::of(entry.at_us);
        let (hour_field, day_field) = ledger_fields(&id.group, id.user.as_ref());
        for (period, field) in [(hour, hour_field), (day, day_field)] {
            let expires = period.expires_us(retention);
            if ((expires - now) as f64) < LEDGER_MIN_LIFE_US {
                continue;
            }
            let key = tenant.ledger(period);
            let (rows, expires_at) = d.ledger.entry(key).or_default();
            if *expires_at <= now {
                // The hash expired (Redis would have dropped it).
                rows.clear();
            }
            match rows.get_mut(&field) {
                Some(row) => row.add(&entry.row),
                None => {
                    rows.insert(field, entry.row);
                    *expires_at = expires;
                }
            }
        }
    }

    /// `tenant`'s rows of each period, by group then user.
    pub(super) fn ledger_rows(&self, tenant: &TenantId, periods: &[Period]) -> Vec<Vec<LedgerRow>> {
        let now = self.clock.now_us();
        let d = self.lock(now);
        periods
            .iter()
            .map(|p| {
                d.ledger
                    .get(&self.keys.ledger(tenant, *p))
                    .filter(|(_, exp)| *exp > now)
                    .map_or_else(Vec::new, |(rows, _)| {
                        let mut out: Vec<LedgerRow> = rows
                            .iter()
                            .filter_map(|(f, r)| ledger_row(*p, f, *r))
                            .collect();
                        out.sort_by(|a, b| (&a.group, &a.user).cmp(&(&b.group, &b.user)));
                        out
                    })
            })
            .collect()
    }

    /// Every tenant with hourly (`hourly`) or daily rows, and which periods.
    pub(super) fn ledger_periods(&self, hourly: bool) -> Vec<(TenantId, Period)> {
        let now = self.clock.now_us();
        // The keys copied under the lock, read after it: decisions wait on
        // the lock for a copy, not for the parsing.
        let keys: Vec<String> = {
            let d = self.lock(now);
            d.ledger
                .iter()
                .filter(|(_, (_, exp))| *exp > now)
                .map(|(key, _)| key.clone())
                .collect()
        };
        let mut out: Vec<(TenantId, Period)> = keys
            .iter()
            .filter_map(|key| self.keys.parse_ledger(key))
            .filter(|(_, p)| matches!(p, Period::Hour(_)) == hourly)
            .collect();
        out.sort();
        out.dedup();
        out
    }
}
