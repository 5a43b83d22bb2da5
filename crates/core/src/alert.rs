//! Threshold alerts: which fractions of a limit to warn at (`alert_at`), when
//! an operation crosses one, whether that crossing is new, and the record a
//! store queues for it — the one rule the memory store runs and
//! `crates/store/lua/alerts.lua` ports.
//!
//! A bucket's *use* is its limit less its level (what is reserved or spent,
//! debt included). An operation crosses threshold `t` of a bucket when the use
//! before it is below `t × limit` and the use after it is at least that.
//! Each (level, bucket, threshold) keeps a marker in its level's hash: for a
//! calendar window, the start of the window it last fired in (one alert per
//! window); for a rolling limit, when it was last crossed — it fires again
//! only once a whole period has passed since (or the level's key has expired,
//! all of it refilled). A crossing that fires is queued with the record below,
//! in the same atomic step as the operation.

use crate::level::Dimension;
use crate::window::WindowKind;

/// The most thresholds one limit takes.
pub const MAX_THRESHOLDS: usize = 8;

/// A limit's thresholds, fractions of it in ascending order, stored in
/// basis points (0.8 → 8000) so a limit stays `Copy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Thresholds {
    basis_points: [u16; MAX_THRESHOLDS],
    len: u8,
}

impl Thresholds {
    /// The thresholds `fractions` (each above 0 and at most 2, in steps of
    /// 0.0001; at most [`MAX_THRESHOLDS`], no two equal), sorted; or what is
    /// wrong with them.
    pub fn new(fractions: &[f64]) -> Result<Self, String> {
        let err = |problem: String| problem;
        if fractions.len() > MAX_THRESHOLDS {
            return Err(err(format!(
                "has {} thresholds; at most {MAX_THRESHOLDS}",
                fractions.len()
            )));
        }
        let mut t = Thresholds::default();
        for &f in fractions {
            let bp = (f * 10_000.0).round();
            if !(f > 0.0 && f <= 2.0) || (bp - f * 10_000.0).abs() > 1e-6 {
                return Err(err(format!(
                    "{f} is no threshold: write a fraction of the limit above 0 and at most 2 \
                     (0.8 for 80%), with at most four decimals"
                )));
            }
            if t.basis_points[..t.len as usize].contains(&(bp as u16)) {
                return Err(err(format!("{f} is given twice")));
            }
            t.basis_points[t.len as usize] = bp as u16;
            t.len += 1;
        }
        t.basis_points[..t.len as usize].sort_unstable();
        Ok(t)
    }

    /// No thresholds.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The fractions, ascending.
    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        self.basis_points[..self.len as usize]
            .iter()
            .map(|&bp| f64::from(bp) / 10_000.0)
    }
}

/// The thresholds an operation moving a bucket of `limit` from `before` to
/// `after` (its levels) crosses upward, ascending.
pub fn crossed(
    thresholds: &Thresholds,
    limit: f64,
    before: f64,
    after: f64,
) -> impl Iterator<Item = f64> + '_ {
    let (used_before, used_after) = (limit - before, limit - after);
    thresholds
        .iter()
        .filter(move |t| used_before < t * limit && used_after >= t * limit)
}

/// A threshold as a percentage for people: `80`, `95`, `57.5`.
pub fn percent(threshold: f64) -> String {
    let bp = (threshold * 10_000.0).round() as i64;
    match bp % 100 {
        0 => format!("{}", bp / 100),
        _ => format!("{}", bp as f64 / 100.0),
    }
}

/// One crossing an operation made: what its alert reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Crossing {
    /// The plan entry whose bucket crossed (outermost first).
    pub level: usize,
    /// The bucket's id (`budget::state::bucket_id`).
    pub bucket_id: f64,
    /// Its limit.
    pub limit: f64,
    /// Its use after the operation.
    pub used: f64,
    /// The threshold crossed (a fraction of the limit).
    pub threshold: f64,
    /// A calendar window's start (µs); 0 for a rolling limit.
    pub window_start_us: f64,
}

impl Crossing {
    /// Whether the crossing fires given its marker (`None`: none stored) at
    /// `now`: once per calendar window; for a rolling limit of `period_us`,
    /// once a whole period has passed since it last crossed.
    pub fn fires(&self, marker: Option<f64>, now: f64) -> bool {
        match (marker, self.window_start_us > 0.0) {
            (None, _) => true,
            (Some(m), true) => m != self.window_start_us,
            (Some(m), false) => now - m >= self.period_us(),
        }
    }

    /// The marker it leaves at `now`, fired or not: the window's start, or now.
    pub fn marker(&self, now: f64) -> f64 {
        match self.window_start_us > 0.0 {
            true => self.window_start_us,
            false => now,
        }
    }

    /// A rolling bucket's period (µs), from its id.
    fn period_us(&self) -> f64 {
        use crate::layout::DIMENSION_SCALE;
        self.bucket_id.rem_euclid(DIMENSION_SCALE) * 1e6
    }

    /// The marker's field in its level's hash: `a<bucket id>:<threshold in
    /// basis points>`.
    pub fn marker_field(&self) -> String {
        format!(
            "a{}:{}",
            self.bucket_id as i64,
            (self.threshold * 10_000.0).round() as i64
        )
    }

    /// The record queued for it at `now`, naming its level's key `level_key`:
    /// six little-endian doubles (now, bucket id, limit, use, threshold,
    /// window start), then the key.
    pub fn record(&self, now: f64, level_key: &str) -> Vec<u8> {
        let mut r = Vec::with_capacity(48 + level_key.len());
        for v in [
            now,
            self.bucket_id,
            self.limit,
            self.used,
            self.threshold,
            self.window_start_us,
        ] {
            r.extend_from_slice(&v.to_le_bytes());
        }
        r.extend_from_slice(level_key.as_bytes());
        r
    }
}

/// What a bucket id says of its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOf {
    /// What it counts.
    pub dimension: Dimension,
    /// A rolling period (seconds), or `None` for a calendar window.
    pub period_secs: Option<u64>,
    /// A calendar window's kind.
    pub window: Option<WindowKind>,
    /// The model group's tag (0: all models).
    pub group_tag: u32,
}

impl LimitOf {
    /// Reads `bucket_id` (`budget::state::bucket_id`).
    pub fn of(bucket_id: f64) -> LimitOf {
        use crate::layout::{DIMENSION_SCALE, GROUP_SCALE, WINDOW_PERIODS};
        let id = bucket_id as u64;
        let (group, dim, period) = (
            id / GROUP_SCALE as u64,
            id % GROUP_SCALE as u64 / DIMENSION_SCALE as u64,
            id % DIMENSION_SCALE as u64,
        );
        let dimension = Dimension::from_code(dim as usize).unwrap_or(Dimension::Requests);
        let windowed = period >= WINDOW_PERIODS as u64;
        LimitOf {
            dimension,
            period_secs: (!windowed).then_some(period),
            window: windowed
                .then(|| WindowKind::of_tag((period - WINDOW_PERIODS as u64) as u32))
                .flatten(),
            group_tag: group as u32,
        }
    }
}

/// A queued record read back.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertRecord {
    /// When it crossed (µs).
    pub at_us: f64,
    /// The crossing (its `level` is 0: the key says which).
    pub crossing: Crossing,
    /// The key of the level that crossed.
    pub level_key: String,
}

impl AlertRecord {
    /// Reads a record; `None` when the bytes are none.
    pub fn decode(bytes: &[u8]) -> Option<AlertRecord> {
        if bytes.len() < 48 {
            return None;
        }
        let d =
            |i: usize| f64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        Some(AlertRecord {
            at_us: d(0),
            crossing: Crossing {
                level: 0,
                bucket_id: d(1),
                limit: d(2),
                used: d(3),
                threshold: d(4),
                window_start_us: d(5),
            },
            level_key: String::from_utf8(bytes[48..].to_vec()).ok()?,
        })
    }
}

/// A record's event id: the SHA-1 of its bytes in hex, as `redis.sha1hex`
/// makes it — the same on every retry of one crossing.
pub fn event_id(record: &[u8]) -> String {
    sha1_smol::Sha1::from(record).digest().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_fractions_sorted_and_checked() {
        let t = Thresholds::new(&[1.0, 0.8, 0.95]).unwrap();
        assert_eq!(t.iter().collect::<Vec<_>>(), [0.8, 0.95, 1.0]);
        let twice = [0.8, 0.8000000000001];
        for bad in [
            &[0.0][..],
            &[2.5],
            &[0.12345],
            &[0.8, 0.8],
            &twice,
            &[0.1; 9],
        ] {
            assert!(Thresholds::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_crossing_is_from_below_to_at_or_above() {
        let t = Thresholds::new(&[0.8, 0.95, 1.0]).unwrap();
        // Use 700 → 960 of 1,000: 80% and 95%.
        assert_eq!(
            crossed(&t, 1000.0, 300.0, 40.0).collect::<Vec<_>>(),
            [0.8, 0.95]
        );
        // Already at 80%: only what is new.
        assert_eq!(
            crossed(&t, 1000.0, 200.0, -5.0).collect::<Vec<_>>(),
            [0.95, 1.0]
        );
        // Going down crosses nothing.
        assert_eq!(crossed(&t, 1000.0, 40.0, 300.0).count(), 0);
    }

    #[test]
    fn a_calendar_crossing_fires_once_a_window_and_a_rolling_one_once_a_period() {
        let month = Crossing {
            level: 1,
            bucket_id: 1.0 * 1e8 + 5.0 * 1e7 + 9_300_000.0,
            limit: 1e8,
            used: 8e7,
            threshold: 0.8,
            window_start_us: 1.7e15,
        };
        assert!(month.fires(None, 1.8e15));
        assert!(!month.fires(Some(1.7e15), 1.8e15), "same window");
        assert!(month.fires(Some(1.6e15), 1.8e15), "a new window");
        let minute = Crossing {
            bucket_id: 2.0 * 1e7 + 60.0,
            window_start_us: 0.0,
            ..month
        };
        assert_eq!(minute.marker(5e6), 5e6);
        assert!(!minute.fires(Some(5e6), 5e6 + 59e6));
        assert!(minute.fires(Some(5e6), 5e6 + 60e6));
        let r = month.record(1.8e15, "ctxb:{YWNtZQ}:t");
        let back = AlertRecord::decode(&r).unwrap();
        assert_eq!(
            (back.at_us, back.level_key.as_str()),
            (1.8e15, "ctxb:{YWNtZQ}:t")
        );
        assert_eq!(back.crossing, Crossing { level: 0, ..month });
        assert_eq!(event_id(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        let shown: Vec<String> = [0.8, 0.57, 0.575, 1.0, 2.0].map(percent).into();
        assert_eq!(shown, ["80", "57", "57.5", "100", "200"]);
    }
}
