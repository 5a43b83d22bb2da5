//! A provider's usage export: which of its columns hold what (`--columns`),
//! and one CSV record read as an hour, a model and its usage. Times, token
//! counts and USD amounts are parsed exactly (USD to whole µ$).

use super::{HOUR_US, ReconcileError, Theirs};
use chrono::{DateTime, NaiveDateTime};

/// The columns of a provider export, by their names in its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Columns {
    /// The hour's start (RFC 3339, `YYYY-MM-DD HH:MM[:SS]` in UTC, or Unix seconds).
    pub hour_start: String,
    /// The model name.
    pub model: String,
    /// Input tokens.
    pub input_tokens: String,
    /// Cached input tokens (optional in the file).
    pub cached_input_tokens: String,
    /// Input tokens written to the cache for 5 minutes (optional in the file).
    pub cache_write_input_tokens: String,
    /// Input tokens written to the cache for an hour (optional in the file).
    pub cache_write_1h_input_tokens: String,
    /// Output tokens.
    pub output_tokens: String,
    /// Of the output, reasoning tokens (optional in the file).
    pub reasoning_tokens: String,
    /// Cost in USD (optional in the file).
    pub cost: String,
}

impl Default for Columns {
    fn default() -> Self {
        Columns {
            hour_start: "hour_start".into(),
            model: "model".into(),
            input_tokens: "input_tokens".into(),
            cached_input_tokens: "cached_input_tokens".into(),
            cache_write_input_tokens: "cache_write_input_tokens".into(),
            cache_write_1h_input_tokens: "cache_write_1h_input_tokens".into(),
            output_tokens: "output_tokens".into(),
            reasoning_tokens: "reasoning_tokens".into(),
            cost: "cost".into(),
        }
    }
}

impl Columns {
    /// The defaults with `mapping` applied: `ours=theirs` pairs separated by
    /// commas, e.g. `hour_start=start_time,cost=amount_usd`.
    pub fn with_mapping(mapping: &str) -> Result<Columns, ReconcileError> {
        let mut c = Columns::default();
        for pair in mapping.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (ours, theirs) = pair.split_once('=').ok_or_else(|| {
                ReconcileError(format!(
                    "--columns {pair:?}: write ours=theirs, e.g. hour_start=start_time"
                ))
            })?;
            let slot = match ours.trim() {
                "hour_start" => &mut c.hour_start,
                "model" => &mut c.model,
                "input_tokens" => &mut c.input_tokens,
                "cached_input_tokens" => &mut c.cached_input_tokens,
                "cache_write_input_tokens" => &mut c.cache_write_input_tokens,
                "cache_write_1h_input_tokens" => &mut c.cache_write_1h_input_tokens,
                "output_tokens" => &mut c.output_tokens,
                "reasoning_tokens" => &mut c.reasoning_tokens,
                "cost" => &mut c.cost,
                other => {
                    return Err(ReconcileError(format!(
                        "--columns: {other:?} is not a column; the columns are hour_start, \
                         model, input_tokens, cached_input_tokens, cache_write_input_tokens, \
                         cache_write_1h_input_tokens, output_tokens, reasoning_tokens and cost"
                    )));
                }
            };
            *slot = theirs.trim().to_owned();
        }
        Ok(c)
    }
}

/// Where each column is in a file's header.
#[derive(Clone, Copy, Debug)]
pub struct Positions {
    hour_start: usize,
    model: usize,
    input_tokens: usize,
    cached_input_tokens: Option<usize>,
    cache_write_input_tokens: Option<usize>,
    cache_write_1h_input_tokens: Option<usize>,
    output_tokens: usize,
    reasoning_tokens: Option<usize>,
    cost: Option<usize>,
}

impl Positions {
    /// Finds `columns` in `header`; hour start, model, input and output
    /// tokens are required.
    pub fn find(columns: &Columns, header: &[&str]) -> Result<Positions, ReconcileError> {
        let at = |name: &str| header.iter().position(|h| h.trim() == name);
        let need = |name: &str, ours: &str| {
            at(name).ok_or_else(|| {
                ReconcileError(format!(
                    "the provider file has no {name:?} column (for {ours}); its columns are {}; \
                     map yours with --columns {ours}=<column>",
                    header.join(", ")
                ))
            })
        };
        Ok(Positions {
            hour_start: need(&columns.hour_start, "hour_start")?,
            model: need(&columns.model, "model")?,
            input_tokens: need(&columns.input_tokens, "input_tokens")?,
            cached_input_tokens: at(&columns.cached_input_tokens),
            cache_write_input_tokens: at(&columns.cache_write_input_tokens),
            cache_write_1h_input_tokens: at(&columns.cache_write_1h_input_tokens),
            output_tokens: need(&columns.output_tokens, "output_tokens")?,
            reasoning_tokens: at(&columns.reasoning_tokens),
            cost: at(&columns.cost),
        })
    }
}

/// One provider row: its hour (µs, the start), model and usage.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderRow {
    /// The start of the hour its time falls in (µs).
    pub hour_us: i64,
    /// The model name as the provider writes it.
    pub model: String,
    /// The usage.
    pub usage: Theirs,
}

/// Reads one record of the file (line `line`, for errors).
pub fn provider_row(
    record: &[&str],
    at: &Positions,
    line: u64,
) -> Result<ProviderRow, ReconcileError> {
    let cell = |i: usize| record.get(i).map(|s| s.trim()).unwrap_or("");
    let err = |what: &str, v: &str| ReconcileError(format!("line {line}: {what} {v:?}"));
    let hour = parse_time(cell(at.hour_start)).ok_or_else(|| {
        err(
            "is no time (RFC 3339, YYYY-MM-DD HH:MM:SS UTC, or Unix seconds):",
            cell(at.hour_start),
        )
    })?;
    let tokens = |i: usize| parse_count(cell(i)).ok_or_else(|| err("is no token count:", cell(i)));
    let opt = |i: Option<usize>, parse: fn(&str) -> Option<u64>, what: &str| match i {
        Some(i) if !cell(i).is_empty() => {
            parse(cell(i)).map(Some).ok_or_else(|| err(what, cell(i)))
        }
        _ => Ok(None),
    };
    let count = |i| opt(i, parse_count, "is no token count:");
    Ok(ProviderRow {
        hour_us: hour - hour.rem_euclid(HOUR_US),
        model: cell(at.model).to_owned(),
        usage: Theirs {
            input_tokens: tokens(at.input_tokens)?,
            cached_input_tokens: count(at.cached_input_tokens)?,
            cache_write_input_tokens: count(at.cache_write_input_tokens)?,
            cache_write_1h_input_tokens: count(at.cache_write_1h_input_tokens)?,
            output_tokens: tokens(at.output_tokens)?,
            reasoning_tokens: count(at.reasoning_tokens)?,
            cost_micros: opt(at.cost, parse_usd, "is no amount of USD:")?,
        },
    })
}

/// RFC 3339, `YYYY-MM-DD HH:MM[:SS]` or `YYYY-MM-DDTHH:MM[:SS]` (UTC), or
/// Unix seconds, as µs.
fn parse_time(s: &str) -> Option<i64> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.timestamp_micros());
    }
    for f in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, f) {
            return Some(t.and_utc().timestamp_micros());
        }
    }
    let secs: i64 = s.parse().ok()?;
    secs.checked_mul(1_000_000)
}

/// A whole count (`1200`, or `1200.0`).
fn parse_count(s: &str) -> Option<u64> {
    if let Ok(n) = s.parse::<u64>() {
        return Some(n);
    }
    let f: f64 = s.parse().ok()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 9e15).then_some(f as u64)
}

/// Decimal USD (`$` allowed) as µ$, exactly, rounding half up past six decimals.
pub fn parse_usd(s: &str) -> Option<u64> {
    let s = s.trim().trim_start_matches('$');
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut micros: u64 = 0;
    for (i, b) in frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(6)
        .enumerate()
    {
        micros += u64::from(b - b'0') * 10u64.pow(5 - i as u32);
    }
    let round_up = frac.as_bytes().get(6).is_some_and(|b| *b >= b'5');
    whole
        .checked_mul(1_000_000)?
        .checked_add(micros + u64::from(round_up))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_rows_read_in_their_columns_and_usd_is_exact() {
        let columns = Columns::with_mapping("hour_start=start_time, cost=amount").unwrap();
        let header = [
            "start_time",
            "model",
            "input_tokens",
            "output_tokens",
            "amount",
        ];
        let at = Positions::find(&columns, &header).unwrap();
        let row = provider_row(
            &[
                "1764583200",
                "gpt-4o-2024-08-06",
                "1200",
                "300",
                "$0.0055005",
            ],
            &at,
            2,
        )
        .unwrap();
        assert_eq!(row.hour_us, 1_764_583_200_000_000);
        assert_eq!(row.usage.cached_input_tokens, None, "no cached column");
        assert_eq!(
            row.usage.cost_micros,
            Some(5_501),
            "rounded half up past six decimals"
        );
        assert_eq!(parse_usd("12.5"), Some(12_500_000));
        assert_eq!(parse_usd("1e3"), None);
        let err = Positions::find(&Columns::default(), &header).unwrap_err().0;
        assert!(err.contains("--columns hour_start=<column>"), "{err}");
        let bad = provider_row(&["soon", "m", "1", "1", ""], &at, 7)
            .unwrap_err()
            .0;
        assert!(bad.starts_with("line 7"), "{bad}");
        assert!(Columns::with_mapping("tokens=x").is_err());
        let half = provider_row(&["2026-12-01 10:59:59", "m", "1", "1", ""], &at, 3).unwrap();
        assert_eq!(half.hour_us % HOUR_US, 0, "a time counts in its hour");
    }
}
