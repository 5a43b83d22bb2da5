//! CheckAndReserve's fallback candidates (decided by the one pipeline,
//! [`crate::engine::Engine::reserve`]):
//! validated from the request, answered in the response beside the
//! reservation [`convert`](super::convert) builds.

use super::convert::{check_label, dimension, level, reason, reserve_response};
use crate::domain::InvalidInput;
use crate::engine::{MAX_CANDIDATES, ReserveOutcome};
use crate::pb;

/// A CheckAndReserve request's fallback models (the candidates after the
/// first, which becomes `model`), validated: empty when it names no
/// candidates; otherwise labels, at most [`MAX_CANDIDATES`], `model` empty
/// or the first, and no idempotency key (a retry could then hold two
/// candidates' reservations).
pub(super) fn fallbacks(r: &mut pb::CheckAndReserveRequest) -> Result<Vec<String>, InvalidInput> {
    let mut list = std::mem::take(&mut r.candidate_models);
    if list.is_empty() {
        return Ok(list);
    }
    let bad = |m: String| Err(InvalidInput::new("candidate_models", m));
    if list.len() > MAX_CANDIDATES {
        return bad(format!("{} models; at most {MAX_CANDIDATES}", list.len()));
    }
    for (i, m) in list.iter().enumerate() {
        check_label("candidate_models", m)?;
        if m.is_empty() {
            return bad("holds an empty model name".into());
        }
        if list[..i].contains(m) {
            return bad(format!(
                "names {:?} twice: name each model once",
                m.chars().take(64).collect::<String>()
            ));
        }
    }
    if !r.model.is_empty() && r.model != list[0] {
        return bad(format!(
            "model is {:?} but the first candidate is {:?}: leave model empty, or make it the \
             first candidate",
            r.model.chars().take(64).collect::<String>(),
            list[0].chars().take(64).collect::<String>()
        ));
    }
    if !r.idempotency_key.is_empty() {
        return bad(
            "cannot be combined with an idempotency_key (a retry could hold two candidates' \
             reservations): retry without a key, or name one model"
                .into(),
        );
    }
    r.model = list.remove(0);
    Ok(list)
}

/// The response to CheckAndReserve with candidates: the reservation, the
/// candidate chosen and those skipped.
pub(super) fn fallback_response(mut out: ReserveOutcome) -> pb::CheckAndReserveResponse {
    let chosen_model = out.chosen_model.take().unwrap_or_default();
    let skipped = std::mem::take(&mut out.skipped);
    let mut resp = reserve_response(out);
    resp.chosen_model = chosen_model;
    resp.skipped_candidates = skipped
        .into_iter()
        .map(|s| {
            let d = s.denial;
            let mut c = pb::SkippedCandidate {
                model: s.model,
                retry_after_ms: d.retry_after_ms,
                model_group: d.model_group.unwrap_or_default(),
                detail: d.detail,
                ..Default::default()
            };
            c.set_reason(reason(d.reason));
            c.set_level(d.level.map_or(pb::Level::Unspecified, level));
            c.set_dimension(d.dimension.map_or(pb::Dimension::Unspecified, dimension));
            c
        })
        .collect();
    resp
}
