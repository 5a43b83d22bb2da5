//! Flag values the command line reads itself: an instant (`--from`, `--to`),
//! a percentage (`--max-drift`), and how a report sums (`--by`). The errors
//! name the flag, or say what it takes.

use anyhow::anyhow;

/// `2026-12-01` (00:00 UTC that day) or an RFC 3339 time, as µs since the epoch.
pub(super) fn parse_instant(text: &str) -> anyhow::Result<i64> {
    crate::admin::usage::parse_instant(text).map_err(|e| anyhow!(e))
}

/// `--max-drift`: a percentage, `1%` or `1` (1%), `0.5%`, as a share of 1.
pub(super) fn parse_max_drift(s: &str) -> anyhow::Result<f64> {
    crate::admin::reconcile::parse_max_drift(s).map_err(|e| anyhow!("--max-drift {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_mean_midnight_utc() {
        let day = parse_instant("2026-12-01").unwrap();
        assert_eq!(day, parse_instant("2026-12-01T07:00:00+07:00").unwrap());
        let half = parse_instant("2026-12-01T10:30:00Z").unwrap();
        assert_eq!(half - day, 37_800_000_000);
        let err = parse_instant("12/01/2026").unwrap_err().to_string();
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn drift_is_a_percentage() {
        assert_eq!(parse_max_drift("1%").unwrap(), 0.01);
        assert!(parse_max_drift("lots").is_err());
        assert!("week".parse::<crate::domain::usage::By>().is_err());
    }
}
