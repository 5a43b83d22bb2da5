//! The rows of `ctxbudget inspect`: the buckets stored in a level's hash —
//! each id taken apart into model group, dimension and period, and refilled to
//! now where the limit is known — and the live leases of a level hash or of a
//! model group's slots hash.

use crate::domain::budget::state::{LevelState, bucket_id};
use crate::domain::decision::period_label;
use crate::domain::layout::WINDOW_PERIODS;
use crate::domain::layout::{DIMENSION_SCALE, GROUP_SCALE};
use crate::domain::{BucketSpec, Dimension, Level, ModelGroups};
use serde::Serialize;
use std::collections::BTreeMap;

/// One stored bucket.
#[derive(Serialize)]
pub(super) struct BucketRow {
    /// `global`, `tenant`, `user` or `session`.
    pub level: &'static str,
    /// The model group the bucket limits (`None`: all models); a tag no
    /// configured group has reads `tag N`.
    pub model_group: Option<String>,
    /// `requests`, `tokens`, `input_tokens` or `output_tokens`.
    pub dimension: String,
    /// `1m`, `1h`, …
    pub period: String,
    /// The limit, when the configuration plans this bucket (with `--tier`).
    pub limit: Option<u64>,
    /// Level now (refilled) when the limit is known; as stored otherwise.
    pub level_now: f64,
    /// True below zero: a commit charged more than was reserved.
    pub debt: bool,
    /// Until the bucket is full again, when the limit is known.
    pub full_in_ms: Option<u64>,
    /// How long ago the level was stored.
    pub stored_ms_ago: u64,
}

/// One live lease.
#[derive(Serialize)]
pub(super) struct LeaseRow {
    /// `global`, `tenant`, `user` or `session`.
    pub level: &'static str,
    /// The model group whose slots hold it (`None`: the level's own).
    pub model_group: Option<String>,
    /// The reservation's id as its client holds it (`rsv_…`), when `inspect`
    /// could rebuild it (see `inspect_ids`).
    pub reservation_id: Option<String>,
    /// The reservation's nonce (base64url): the lease's name in the hash and
    /// the key of the reservation's record.
    pub nonce: String,
    /// Until the lease lapses (negative: lapsed, not yet reclaimed).
    pub expires_in_ms: i64,
}

/// A stored bucket id taken apart (see `domain::budget::state::bucket_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BucketId {
    /// The model group's tag; 0: all models.
    pub tag: u32,
    /// The dimension digit.
    pub digit: u64,
    /// The period in seconds.
    pub period_secs: u64,
}

impl BucketId {
    /// Takes `id` apart: tag × 10⁸ + dimension × 10⁷ + period.
    pub(super) fn decode(id: f64) -> Self {
        // Ids are exact integers far below 2⁵³ (see `domain::model::TAG_SPACE`).
        let id = id.max(0.0) as u64;
        let (group, dimension) = (GROUP_SCALE as u64, DIMENSION_SCALE as u64);
        BucketId {
            tag: u32::try_from(id / group).unwrap_or(u32::MAX),
            digit: id % group / dimension,
            period_secs: id % dimension,
        }
    }

    /// The dimension's name; an unknown digit reads `dimension N`.
    pub(super) fn dimension(&self) -> String {
        usize::try_from(self.digit)
            .ok()
            .and_then(Dimension::from_code)
            .map_or(format!("dimension {}", self.digit), |d| {
                d.as_str().to_string()
            })
    }

    /// The name of the group with this id's tag; `None` for all models.
    pub(super) fn group(&self, groups: &ModelGroups) -> Option<String> {
        match self.tag {
            0 => None,
            tag => Some(
                groups
                    .values()
                    .find(|g| g.tag() == tag)
                    .map_or(format!("tag {tag}"), |g| g.name.clone()),
            ),
        }
    }
}

/// The buckets stored in one level's hash, refilled to `now` where `specs`
/// (the planned buckets of the level) know their limit; `groups` name the
/// model groups' buckets.
pub(super) fn bucket_rows(
    level: Level,
    fields: &BTreeMap<String, Vec<u8>>,
    specs: &[&BucketSpec],
    groups: &ModelGroups,
    now: f64,
) -> anyhow::Result<Vec<BucketRow>> {
    let state = fields
        .get("s")
        .map(|raw| LevelState::decode(raw))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .flatten()
        .unwrap_or_default();
    let rows = state.buckets.iter().map(|b| {
        let spec = specs.iter().find(|s| bucket_id(s) == b.id);
        let id = BucketId::decode(b.id);
        let (level_now, full_in_ms) = match spec {
            Some(s) => {
                let l = s.level_now(b.level, b.limit, b.t, now);
                (l, Some(s.reset_after_ms(l)))
            }
            None => (b.level, None),
        };
        BucketRow {
            level: level.as_str(),
            model_group: id.group(groups),
            dimension: id.dimension(),
            period: match spec {
                Some(s) => s.period_label(),
                None if id.period_secs >= WINDOW_PERIODS as u64 => "calendar window".into(),
                None => period_label(id.period_secs),
            },
            limit: spec.map(|s| s.limit),
            level_now,
            debt: level_now < 0.0,
            full_in_ms,
            stored_ms_ago: ((now - b.t).max(0.0) / 1000.0) as u64,
        }
    });
    Ok(rows.collect())
}

/// The live leases in one hash (fields `#nonce`, expiry as f64 µs): a level's
/// own, or model group `group`'s slots at the level.
pub(super) fn lease_rows(
    level: Level,
    group: Option<&str>,
    fields: &BTreeMap<String, Vec<u8>>,
    now: f64,
) -> Vec<LeaseRow> {
    let mut rows = Vec::new();
    for (field, value) in fields {
        if let Some(nonce) = field.strip_prefix('#')
            && let Ok(bytes) = <[u8; 8]>::try_from(value.as_slice())
        {
            let expires = f64::from_le_bytes(bytes);
            rows.push(LeaseRow {
                level: level.as_str(),
                model_group: group.map(str::to_string),
                reservation_id: None,
                nonce: nonce.to_owned(),
                expires_in_ms: ((expires - now) / 1000.0).round() as i64,
            });
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ModelGroup;
    use std::sync::Arc;

    fn spec(dimension: Dimension, period_secs: u64, group: u32) -> BucketSpec {
        BucketSpec {
            level: Level::Tenant,
            dimension,
            limit: 10,
            period_secs,
            group,
            window: None,
            alert_at: Default::default(),
        }
    }

    #[test]
    fn ids_come_apart_into_group_dimension_and_period() {
        let group = ModelGroup {
            name: "gpt-4o".into(),
            patterns: vec!["gpt-4o".into()],
            context_window: None,
            cached_input_counts: true,
            global: Default::default(),
        };
        let tag = group.tag();
        let groups: ModelGroups = [("gpt-4o".to_string(), Arc::new(group))].into();
        let cases = [
            (spec(Dimension::Requests, 60, 0), "requests", None),
            (spec(Dimension::Tokens, 86_400, 0), "tokens", None),
            (
                spec(Dimension::InputTokens, 60, tag),
                "input_tokens",
                Some("gpt-4o".to_string()),
            ),
            (
                spec(Dimension::OutputTokens, 3600, tag),
                "output_tokens",
                Some("gpt-4o".to_string()),
            ),
            (
                spec(Dimension::Requests, 30, 7),
                "requests",
                Some("tag 7".to_string()),
            ),
        ];
        for (s, dimension, group) in cases {
            let id = BucketId::decode(bucket_id(&s));
            assert_eq!((id.tag, id.period_secs), (s.group, s.period_secs), "{s:?}");
            assert_eq!(id.dimension(), dimension, "{s:?}");
            assert_eq!(id.group(&groups), group, "{s:?}");
        }
        assert_eq!(BucketId::decode(9e7 + 60.0).dimension(), "dimension 9");
    }
}
