//! Calendar windows: limits that reset at each boundary of a day, a week
//! (Monday) or a month (the 1st) at 00:00 in an IANA time zone, daylight-saving
//! changes included — beside the rolling periods that refill continuously.
//!
//! The zone arithmetic is done here, in Rust, with the IANA database of
//! `chrono-tz`; the stores never see a zone. A plan carries, per windowed
//! bucket, a [`Span`]: the window around the planning instant and the next
//! boundary after it, so a store whose clock has crossed the boundary since
//! (Redis `TIME` is the store's time) still knows the window it is in.

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDate, TimeZone, Utc};
use chrono_tz::Tz;
use std::fmt;

/// How long a window lasts, in calendar terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WindowKind {
    /// From 00:00 to the next 00:00.
    Day,
    /// From Monday 00:00 to the next Monday 00:00.
    Week,
    /// From the 1st at 00:00 to the next month's 1st.
    Month,
}

impl WindowKind {
    /// The name as written in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            WindowKind::Day => "day",
            WindowKind::Week => "week",
            WindowKind::Month => "month",
        }
    }

    /// Parses `day`, `week` or `month`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "day" => Some(WindowKind::Day),
            "week" => Some(WindowKind::Week),
            "month" => Some(WindowKind::Month),
            _ => None,
        }
    }

    /// The kind a window's tag ([`Window::tag`]) says.
    pub fn of_tag(tag: u32) -> Option<Self> {
        [WindowKind::Day, WindowKind::Week, WindowKind::Month]
            .into_iter()
            .find(|k| k.digit() == tag / 100_000)
    }

    fn digit(self) -> u32 {
        match self {
            WindowKind::Day => 1,
            WindowKind::Week => 2,
            WindowKind::Month => 3,
        }
    }
}

/// A calendar window in a time zone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    /// Day, week or month.
    pub kind: WindowKind,
    /// Where the boundaries are midnight.
    pub tz: Tz,
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.kind.as_str(), self.tz.name())
    }
}

/// The window around an instant and the boundary after it, in µs since the
/// Unix epoch: `start ≤ planned_at < end < next_end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The window's first instant.
    pub start_us: i64,
    /// Its end: the next window's start.
    pub end_us: i64,
    /// The end of the window after.
    pub next_end_us: i64,
    /// The instant the span was computed for.
    pub planned_at_us: i64,
}

impl Span {
    /// The window (start, end) a store is in at its time `now_us`: this one,
    /// or the next once the boundary has passed.
    pub fn at(&self, now_us: f64) -> (f64, f64) {
        if now_us >= self.end_us as f64 {
            (self.end_us as f64, self.next_end_us as f64)
        } else {
            (self.start_us as f64, self.end_us as f64)
        }
    }

    /// Milliseconds from the planning instant to the boundary.
    pub fn reset_after_ms(&self) -> u64 {
        ((self.end_us - self.planned_at_us).max(0) as u64).div_ceil(1000)
    }
}

impl Window {
    /// The span around `now_us`.
    pub fn span(&self, now_us: i64) -> Span {
        let start = self.start_of(now_us);
        let end = self.after(start);
        Span {
            start_us: start,
            end_us: end,
            next_end_us: self.after(end),
            planned_at_us: now_us,
        }
    }

    /// A small number naming the window kind and zone in bucket ids (see
    /// [`crate::layout::WINDOW_PERIODS`]): kind × 10⁵ + a
    /// digest of the zone's name.
    pub fn tag(&self) -> u32 {
        let mut h = super::digest::Fnv::new();
        h.write(self.tz.name().as_bytes());
        self.kind.digit() * 100_000 + (h.finish() % 100_000) as u32
    }

    /// The start (µs) of the window containing `now_us`.
    fn start_of(&self, now_us: i64) -> i64 {
        let local = self.tz.from_utc_datetime(&utc(now_us).naive_utc());
        let date = local.date_naive();
        let first = match self.kind {
            WindowKind::Day => date,
            WindowKind::Week => {
                date - Duration::days(i64::from(date.weekday().num_days_from_monday()))
            }
            WindowKind::Month => date.with_day(1).expect("every month has a 1st"),
        };
        self.midnight(first)
    }

    /// The start (µs) of the window after the one starting at `start_us`.
    fn after(&self, start_us: i64) -> i64 {
        let local = self.tz.from_utc_datetime(&utc(start_us).naive_utc());
        let date = local.date_naive();
        let next = match self.kind {
            WindowKind::Day => date + Duration::days(1),
            WindowKind::Week => date + Duration::days(7),
            WindowKind::Month => {
                let (y, m) = match date.month() {
                    12 => (date.year() + 1, 1),
                    m => (date.year(), m + 1),
                };
                NaiveDate::from_ymd_opt(y, m, 1).expect("a valid 1st")
            }
        };
        self.midnight(next)
    }

    /// 00:00 of `date` in the zone, in µs; where a daylight-saving change
    /// skips midnight, the first instant of the day that exists; where it
    /// repeats it, the earlier.
    fn midnight(&self, date: NaiveDate) -> i64 {
        let mut t = date.and_hms_opt(0, 0, 0).expect("midnight");
        // A gap lasts at most a few hours: step through it by minutes.
        for _ in 0..(24 * 60) {
            match self.tz.from_local_datetime(&t) {
                LocalResult::Single(dt) => return dt.timestamp_micros(),
                LocalResult::Ambiguous(a, b) => return a.min(b).timestamp_micros(),
                LocalResult::None => t += Duration::minutes(1),
            }
        }
        unreachable!("no time zone skips a whole day's first 24 hours")
    }
}

fn utc(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).expect("a time within chrono's range")
}

/// Parses an IANA zone name (`Asia/Bangkok`, `UTC`).
pub fn parse_zone(name: &str) -> Option<Tz> {
    name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        DateTime::parse_from_rfc3339(s).unwrap().timestamp_micros()
    }

    fn window(kind: WindowKind, tz: &str) -> Window {
        Window {
            kind,
            tz: parse_zone(tz).unwrap(),
        }
    }

    #[test]
    fn a_month_starts_on_the_first_at_midnight_in_its_zone() {
        let w = window(WindowKind::Month, "Asia/Bangkok");
        let s = w.span(at("2026-12-15T10:00:00Z"));
        assert_eq!(s.start_us, at("2026-11-30T17:00:00Z"), "1 Dec 00:00 +07");
        assert_eq!(s.end_us, at("2026-12-31T17:00:00Z"), "1 Jan 00:00 +07");
        assert_eq!(s.next_end_us, at("2027-01-31T17:00:00Z"));
        // 31 Dec 18:00 UTC is already January in Bangkok.
        let s = w.span(at("2026-12-31T18:00:00Z"));
        assert_eq!(s.start_us, at("2026-12-31T17:00:00Z"));
    }

    #[test]
    fn days_follow_daylight_saving_changes() {
        let w = window(WindowKind::Day, "Europe/Berlin");
        // 29 March 2026: clocks go from 02:00 to 03:00, a 23-hour day.
        let s = w.span(at("2026-03-29T12:00:00Z"));
        assert_eq!(s.start_us, at("2026-03-28T23:00:00Z"), "00:00 +01");
        assert_eq!(s.end_us, at("2026-03-29T22:00:00Z"), "00:00 +02");
        assert_eq!(s.end_us - s.start_us, 23 * 3_600_000_000);
        // 25 October 2026: a 25-hour day.
        let s = w.span(at("2026-10-25T12:00:00Z"));
        assert_eq!(s.end_us - s.start_us, 25 * 3_600_000_000);
    }

    #[test]
    fn a_skipped_midnight_starts_the_day_at_its_first_instant() {
        // Santiago, 6 September 2026: 00:00 does not exist (clocks jump to 01:00).
        let w = window(WindowKind::Day, "America/Santiago");
        let s = w.span(at("2026-09-06T12:00:00Z"));
        assert_eq!(s.start_us, at("2026-09-06T04:00:00Z"), "01:00 -03");
    }

    #[test]
    fn weeks_start_on_monday_and_a_store_past_the_boundary_is_in_the_next() {
        let w = window(WindowKind::Week, "UTC");
        let s = w.span(at("2026-12-03T09:00:00Z")); // a Thursday
        assert_eq!(s.start_us, at("2026-11-30T00:00:00Z"));
        assert_eq!(s.end_us, at("2026-12-07T00:00:00Z"));
        assert_eq!(s.at(s.end_us as f64 - 1.0).0, s.start_us as f64);
        assert_eq!(
            s.at(s.end_us as f64),
            (s.end_us as f64, s.next_end_us as f64)
        );
        assert_eq!(s.reset_after_ms(), 3 * 86_400_000 + 15 * 3_600_000);
    }

    #[test]
    fn tags_name_kind_and_zone() {
        let a = window(WindowKind::Month, "UTC").tag();
        assert_eq!(a / 100_000, 3);
        assert_ne!(a, window(WindowKind::Month, "Asia/Bangkok").tag());
        assert_ne!(a, window(WindowKind::Day, "UTC").tag());
    }
}
