//! docs/http.md in one place: the HTTP status a decision maps to, and which
//! limit feeds the `x-ratelimit-*` headers; and the HTTP status of each
//! kind of error. The HTTP API, Envoy's rate limit answers (`rls::reply`) and
//! the external processor's answers (`ext_proc`) all follow it, as the
//! Python client's `ctxbudget.http` does.

use crate::app::ErrorKind;
use crate::domain::decision::LimitState;
use crate::domain::{Denial, Dimension, Level, Reason};
use crate::engine::ReserveOutcome;

/// How HTTP states a reservation's answer: 200 when allowed, else the
/// denial's status; `Retry-After` when waiting helps, and the
/// `x-ratelimit-*` headers of the binding limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The headers, names lower case.
    pub headers: Vec<(&'static str, String)>,
}

impl HttpAnswer {
    /// The answer to `out`.
    pub fn of(out: &ReserveOutcome) -> Self {
        let denial = out.denial.as_ref();
        let mut headers = reservation_headers(&out.limits, denial);
        if let Some(secs) = denial.and_then(retry_after) {
            headers.push(("retry-after", secs.to_string()));
        }
        HttpAnswer {
            status: denial.map_or(200, denial_status),
            headers,
        }
    }
}

/// The HTTP status of a denial: 403 for an operator's block, 413 for a
/// request that can never fit, 429 otherwise.
pub fn denial_status(d: &Denial) -> u16 {
    match d.reason {
        Reason::Blocked => 403,
        Reason::ContextTooLarge | Reason::RequestTooLarge => 413,
        _ => 429,
    }
}

/// The HTTP status of an error of `kind`.
pub fn error_status(kind: ErrorKind) -> u16 {
    match kind {
        // The request must change: a field in error, or a body that is no
        // request.
        ErrorKind::Invalid => 400,
        // Larger than `[server] max_message_bytes`.
        ErrorKind::TooLarge => 413,
        ErrorKind::Unauthenticated => 401,
        ErrorKind::Forbidden => 403,
        ErrorKind::NotFound => 404,
        // Well-formed, but the state it names forbids it (a spent
        // idempotency key).
        ErrorKind::Conflict => 409,
        // A write against a version no longer current.
        ErrorKind::Stale => 412,
        // Shed by the admission gate: retry after the hint.
        ErrorKind::Exhausted => 429,
        ErrorKind::DeadlineExceeded => 504,
        // The store cannot answer: the gateway's fail-open/closed choice.
        ErrorKind::Unavailable => 503,
        ErrorKind::Unsupported => 501,
        ErrorKind::Internal => 500,
    }
}

/// `Retry-After` of a denial, whole seconds rounded up: `None` when retrying
/// cannot help (a block, a request that can never fit).
pub fn retry_after(d: &Denial) -> Option<u64> {
    (denial_status(d) == 429).then(|| d.retry_after_ms.div_ceil(1000))
}

/// Among `limits` of the tenant, user and session levels (of `dimension`, when
/// given): the one that denied, else the one with the least left for its
/// size, the innermost level on a tie.
pub fn binding_in<'a>(
    limits: &'a [LimitState],
    denial: Option<&Denial>,
    dimension: Option<Dimension>,
) -> Option<&'a LimitState> {
    let of =
        |l: &&LimitState| l.level != Level::Global && dimension.is_none_or(|d| l.dimension == d);
    let share = |l: &LimitState| l.remaining as f64 / l.limit.max(1) as f64;
    let tightest = |a: &&LimitState, b: &&LimitState| share(a).total_cmp(&share(b));
    // The denying limit; among calendar windows of one level and dimension
    // (all of period 0), the one with the least left.
    if let Some(d) = denial
        && let Some(l) = limits
            .iter()
            .filter(of)
            .filter(|l| {
                Some(l.level) == d.level
                    && Some(l.dimension) == d.dimension
                    && l.period_secs == d.period_secs
                    && l.model_group.as_ref().map(|g| g.name.as_str()) == d.model_group.as_deref()
            })
            .min_by(tightest)
    {
        return Some(l);
    }
    // Ties go to the innermost level (the session's, then the user's), listed last.
    limits.iter().rev().filter(of).min_by(tightest)
}

/// The OpenAI-style headers of docs/http.md, from the limit `binding` gives
/// for requests and for tokens: limit, remaining (debt shows as 0), reset.
pub fn rate_limit_headers<'a>(
    binding: impl Fn(Dimension) -> Option<&'a LimitState>,
) -> Vec<(&'static str, String)> {
    const NAMES: [(Dimension, [&str; 3]); 2] = [
        (
            Dimension::Requests,
            [
                "x-ratelimit-limit-requests",
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ],
        ),
        (
            Dimension::Tokens,
            [
                "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ],
        ),
    ];
    let mut headers = Vec::with_capacity(6);
    for (dimension, [limit, remaining, reset]) in NAMES {
        if let Some(l) = binding(dimension) {
            headers.push((limit, l.limit.to_string()));
            headers.push((remaining, l.remaining.max(0).to_string()));
            headers.push((reset, go_duration(l.reset_after_ms)));
        }
    }
    headers
}

/// The headers of a reservation's answer (docs/http.md): none when the
/// global level denied (its size is not shown), else those of the binding
/// user or tenant limits.
pub fn reservation_headers(
    limits: &[LimitState],
    denial: Option<&Denial>,
) -> Vec<(&'static str, String)> {
    if denial.is_some_and(|d| d.level == Some(Level::Global)) {
        return Vec::new();
    }
    rate_limit_headers(|dimension| binding_in(limits, denial, Some(dimension)))
}

/// OpenAI's reset format (Go's duration): `0s`, `20ms`, `6s`, `1.5s`, `6m0s`,
/// `1h2m3s` (the Python client's `duration`).
pub fn go_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (hours, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (minutes, rest) = (rest / 60_000, rest % 60_000);
    let seconds = format!("{}.{:03}", rest / 1000, rest % 1000);
    let seconds = seconds.trim_end_matches('0').trim_end_matches('.');
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(seconds);
    out.push('s');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_openai_headers() {
        for (ms, s) in [
            (0, "0s"),
            (20, "20ms"),
            (6000, "6s"),
            (1500, "1.5s"),
            (360_000, "6m0s"),
            (3_723_000, "1h2m3s"),
        ] {
            assert_eq!(go_duration(ms), s);
        }
    }
}
