//! The audit log of configuration changes, newest first, each entry with
//! what it changed, field by field, in full: printed by `ctxbudget tiers
//! history`, served by the admin API (`/admin/v1/history`).
//!
//! ```text
//! 2026-11-30 01:02:00 UTC  alice  tier:pro  version 2 (updated)
//!     user.requests: [{"limit":60,"period":"1m"}] → [{"limit":40,"period":"1m"}]
//! ```

use crate::store::config_repo::{AUDIT_KEEP, AuditEntry, ConfigStore};
use serde_json::Value;
use std::collections::BTreeMap;

/// One change as the admin API shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Shown {
    /// The audit entry.
    #[serde(flatten)]
    pub entry: AuditEntry,
    /// `created`, `updated`, `deleted` or `seeded`.
    pub what: &'static str,
    /// When, `YYYY-MM-DD hh:mm:ss` UTC.
    pub at: String,
    /// What changed, one line per field ([`changes`]).
    pub changes: Vec<String>,
}

/// The newest `limit` audit entries, of document `field` only when given
/// (`tier:pro`; among the newest entries the log keeps).
pub async fn history(
    cfg: &ConfigStore,
    field: Option<&str>,
    limit: usize,
) -> Result<Vec<Shown>, crate::store::StoreError> {
    let Some(field) = field else {
        let entries = cfg.history(limit).await?;
        return Ok(entries.into_iter().map(shown).collect());
    };
    // One document's entries: the log read a page at a time, newest first,
    // until enough are found (each page a short call, so Redis never stalls
    // on the whole log).
    let mut found = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..(AUDIT_KEEP as usize).div_ceil(PAGE) {
        let page = cfg.history_before(before.as_deref(), PAGE).await?;
        let last = page.len() < PAGE;
        before = page.last().map(|e| e.id.clone());
        found.extend(page.into_iter().filter(|e| e.field == field).map(shown));
        if last || found.len() >= limit {
            break;
        }
    }
    found.truncate(limit);
    Ok(found)
}

/// Entries read at once while looking for one document's.
const PAGE: usize = 200;

/// An entry as the admin API shows it.
fn shown(e: AuditEntry) -> Shown {
    Shown {
        what: what(&e),
        at: utc(e.at_ms),
        changes: changes(&e.old, &e.new),
        entry: e,
    }
}

/// What an entry did.
pub fn what(e: &AuditEntry) -> &'static str {
    match (e.old.is_empty(), e.new.is_empty()) {
        _ if e.field == "*" => "seeded",
        (true, _) => "created",
        (false, true) => "deleted",
        (false, false) => "updated",
    }
}

/// What changed between two stored documents, one line per field whose value
/// differs (`path: old → new`, `-` for absent); texts that are not JSON
/// documents (a seed's summary) as they are.
pub fn changes(old: &str, new: &str) -> Vec<String> {
    let (Some(before), Some(after)) = (fields(old), fields(new)) else {
        let mut lines = Vec::new();
        if !old.is_empty() {
            lines.push(format!("old: {old}"));
        }
        if !new.is_empty() {
            lines.push(format!("new: {new}"));
        }
        return lines;
    };
    let mut paths: Vec<&String> = before.keys().chain(after.keys()).collect();
    paths.sort();
    paths.dedup();
    let shown = |v: Option<&Value>| v.map_or("-".to_string(), Value::to_string);
    let lines: Vec<String> = paths
        .into_iter()
        .filter(|p| before.get(*p) != after.get(*p))
        .map(|p| format!("{p}: {} → {}", shown(before.get(p)), shown(after.get(p))))
        .collect();
    if lines.is_empty() {
        vec!["(no change)".into()]
    } else {
        lines
    }
}

/// A JSON document's values by dotted path (objects flattened, lists and
/// numbers kept whole); '' is an empty document; `None`: not a JSON object.
fn fields(text: &str) -> Option<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    if text.is_empty() {
        return Some(out);
    }
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(text) else {
        return None;
    };
    flatten("", &Value::Object(map), &mut out);
    Some(out)
}

fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) if !map.is_empty() || prefix.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&path, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// `ms` since the epoch as `YYYY-MM-DD hh:mm:ss`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formats_the_epoch_and_a_leap_day() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_709_164_800_000), "2024-02-29 00:00:00");
    }

    #[test]
    fn a_change_shows_every_changed_field_in_full() {
        let long = "x".repeat(200);
        let old = format!(
            r#"{{"max_context_tokens":1000,"user":{{"requests":[{{"limit":60,"period":"1m"}}]}},"note":"{long}"}}"#
        );
        let new = r#"{"max_context_tokens":1000,"user":{"requests":[{"limit":40,"period":"1m"}],"concurrency":5}}"#;
        assert_eq!(
            changes(&old, new),
            vec![
                format!("note: \"{long}\" → -"),
                "user.concurrency: - → 5".to_string(),
                r#"user.requests: [{"limit":60,"period":"1m"}] → [{"limit":40,"period":"1m"}]"#
                    .to_string(),
            ]
        );
        assert_eq!(changes("", "{}"), vec!["(no change)".to_string()]);
        assert_eq!(
            changes("", "seeded 4 documents"),
            vec!["new: seeded 4 documents"]
        );
        assert_eq!(changes(new, "").len(), 3, "a deletion lists every field");
    }
}
