//! Token-bucket arithmetic with continuous refill: capacity = limit, refill =
//! limit / period.
//!
//! A bucket is a level (a float, so fractions of a unit refill exactly) and the
//! time it was last brought up to date. Levels may go negative: a Commit that used
//! more than it reserved leaves debt, which later requests wait out. `crates/store/lua/*.lua`
//! repeats these formulas operation for operation, so both stores compute the same
//! doubles; stores report levels as whole thousandths ("milli" units).

use super::alert::Thresholds;
use super::level::{DimMap, Dimension, Level};
use super::price::SpendRates;
use super::window::{Span, Window};

/// One bucket as the store sees it: which level and dimension, and its rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketSpec {
    /// The level the bucket belongs to.
    pub level: Level,
    /// A rate dimension: requests, tokens, input or output tokens.
    pub dimension: Dimension,
    /// Capacity, and what refills per period.
    pub limit: u64,
    /// Period in seconds.
    pub period_secs: u64,
    /// The model group's bucket tag ([`crate::model::group_tag`]);
    /// 0 for a limit on all models.
    pub group: u32,
    /// A calendar window instead of the rolling period: the bucket is full
    /// again at each boundary and does not refill in between.
    pub window: Option<Windowed>,
    /// Fractions of the limit to alert at (none: no alerts).
    pub alert_at: Thresholds,
}

/// A calendar window and where its boundaries fall around the plan's instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windowed {
    /// The window (kind and zone).
    pub window: Window,
    /// Its boundaries around the planning instant.
    pub span: Span,
}

/// What one operation moves in the buckets of each dimension: a
/// reservation's cost ([`Cost::reservation`]), a charge's, or, in doubles
/// and negative where it gives back, a settle's correction. The scripts get
/// it as a vector indexed by the dimension's code (`cost[kind]`).
pub type Cost<T = u64> = DimMap<T>;

impl<T: Copy> Cost<T> {
    /// What this takes from a bucket of `dimension`; a concurrency slot
    /// counts as a request.
    pub fn of(&self, dimension: Dimension) -> T {
        match dimension {
            Dimension::Concurrency => self[Dimension::Requests],
            d => self[d],
        }
    }
}

impl<T: Copy + std::ops::Add<Output = T> + From<u8>> Cost<T> {
    /// A reservation's cost: one request, its `prompt` and `output` tokens,
    /// their `spend` (µ$, [`crate::price::SpendRates::spend`]), and
    /// in each dimension the caller counts ([`Dimension::is_declared`]) what
    /// it `declared`. Lua: the plan sends this with no output
    /// (`store/redis/reserve.rs`), and `reserve.lua` puts each level's held
    /// output and spend in the token, output and spend places.
    pub fn reservation(prompt: T, output: T, spend: T, declared: &DimMap<T>) -> Self {
        DimMap::from_fn(|d| match d {
            Dimension::Requests => T::from(1),
            Dimension::Tokens => prompt + output,
            Dimension::InputTokens => prompt,
            Dimension::OutputTokens => output,
            Dimension::Spend => spend,
            _ => declared[d],
        })
    }
}

impl Cost<f64> {
    /// What moving from `self` to `to` changes in each dimension.
    pub fn change_to(self, to: Cost<f64>) -> Cost<f64> {
        DimMap::from_fn(|d| to[d] - self[d])
    }
}

impl BucketSpec {
    /// The period in microseconds: the unit of time of the stores.
    pub fn period_us(&self) -> u64 {
        self.period_secs * 1_000_000
    }

    /// What one reservation of `cost` takes from this bucket.
    pub fn cost(&self, cost: Cost) -> u64 {
        cost.of(self.dimension)
    }

    /// How many output tokens this bucket leaves room for beside the
    /// prompt, given `above_floor`, what it holds beyond the floor of the
    /// request's headroom: the tokens of a token bucket past the prompt,
    /// an output bucket's tokens, what a spend bucket's µ$ pay for at
    /// `rates`; `None` when the bucket does not bound the output. The one
    /// output-room rule of reserve and of the cluster's share (Lua:
    /// `crates/store/lua/splice/output_room.lua`).
    pub fn output_room(&self, above_floor: f64, prompt: f64, rates: SpendRates) -> Option<f64> {
        match self.dimension {
            Dimension::Tokens => Some(above_floor - prompt),
            Dimension::OutputTokens => Some(above_floor),
            Dimension::Spend => rates.output_within(above_floor),
            _ => None,
        }
    }

    /// The level a request with `headroom` must leave in the bucket: that
    /// share of the limit, kept for higher priorities.
    pub fn floor(&self, headroom: f64) -> f64 {
        headroom * self.limit as f64
    }

    /// True when taking `cost` from a level of `level` would leave less than
    /// the floor of `headroom`: the one allow/deny rule of every bucket
    /// (Lua: `l - c < h * lim`; with no headroom, `l < c`).
    pub fn denies(&self, level: f64, cost: f64, headroom: f64) -> bool {
        level - cost < self.floor(headroom)
    }

    /// The level at `now` (µs) of a bucket stored at `stored` at time `t`
    /// under the limit `was`: a windowed bucket stored before its window
    /// began is full, otherwise as stored; a rolling one refilled since —
    /// both [`Self::rebase`]d first when the limit changed. Lua: `if s[k+2] <
    /// ws then l = lim` for windows, the refill otherwise.
    pub fn level_now(&self, stored: f64, was: f64, t: f64, now: f64) -> f64 {
        match self.window {
            Some(w) if t < w.span.at(now).0 => self.limit as f64,
            Some(_) => self.rebase(stored, was),
            None => self.refill(self.rebase(stored, was), (now - t) as i64),
        }
    }

    /// The level of a bucket stored at `level` under the limit `was`, now
    /// that the limit is this one: what was used is kept, so the level moves
    /// by the difference — up when the limit grew, down when it dropped. Use
    /// beyond a lowered limit stays owed (the level below zero, as debt), so
    /// moving between limits never forgives use, whatever the order; a level
    /// is never above its limit, so it never is above the new one either.
    /// `was` 0 is unknown (a state stored before buckets kept their limit):
    /// the level as stored. Lua: in `crates/store/lua/splice/bucket_level.lua`.
    pub fn rebase(&self, level: f64, was: f64) -> f64 {
        let limit = self.limit as f64;
        if was == limit || was <= 0.0 {
            return level;
        }
        level + (limit - was)
    }

    /// How long (µs) a key holding this bucket at `level` must live from
    /// `now`: until a rolling bucket is full again, or until a window ends
    /// (the bucket is full in the next one anyway).
    pub fn keep_us(&self, level: f64, now: f64) -> f64 {
        match self.window {
            Some(w) => w.span.at(now).1 - now,
            None => self.refill_time_us(level, self.limit as f64),
        }
    }

    /// Milliseconds from the plan's instant until the bucket is full again, from
    /// a level of `level`: the refill, or the window's end when not full.
    pub fn reset_after_ms(&self, level: f64) -> u64 {
        match self.window {
            Some(_) if level >= self.limit as f64 => 0,
            Some(w) => w.span.reset_after_ms(),
            None => self.until_full_us(level).div_ceil(1000),
        }
    }

    /// Milliseconds until a level of `level` holds `target`: the refill, or
    /// for a window its end (nothing comes back before).
    pub fn wait_ms(&self, level: f64, target: f64) -> u64 {
        match self.window {
            Some(w) => w.span.reset_after_ms(),
            None => self.until_level_us(level, target).div_ceil(1000),
        }
    }

    /// The period or window as people write it.
    pub fn period_label(&self) -> String {
        match self.window {
            Some(w) => w.window.to_string(),
            None => super::level::period_label(self.period_secs),
        }
    }

    /// The level after `elapsed_us` of refill, never above capacity.
    /// Lua: `l = l + el * lim / per; if l > lim then l = lim end`.
    pub fn refill(&self, level: f64, elapsed_us: i64) -> f64 {
        let elapsed = elapsed_us.max(0) as f64;
        let refilled = level + elapsed * self.limit as f64 / self.period_us() as f64;
        refilled.min(self.limit as f64)
    }

    /// The level after settling `delta` more units than were reserved: an
    /// overage (delta > 0) may go into debt; a surplus never overfills.
    /// Lua: `l = l - d; if d < 0 and l > lim then l = lim end`.
    pub fn settle(&self, level: f64, delta: f64) -> f64 {
        let settled = level - delta;
        if delta < 0.0 && settled > self.limit as f64 {
            self.limit as f64
        } else {
            settled
        }
    }

    /// Microseconds until `level` has refilled to `target`, unrounded: what a
    /// key must outlive. Lua: `(lim - l) * per / lim` for the target `lim`.
    pub fn refill_time_us(&self, level: f64, target: f64) -> f64 {
        (target - level) * self.period_us() as f64 / self.limit as f64
    }

    /// Microseconds until a level of `level` refills to full, rounded up.
    pub fn until_full_us(&self, level: f64) -> u64 {
        self.until_level_us(level, self.limit as f64)
    }

    /// Microseconds until `level` has refilled to `target`, rounded up.
    pub fn until_level_us(&self, level: f64, target: f64) -> u64 {
        if level >= target {
            return 0;
        }
        self.refill_time_us(level, target).ceil() as u64
    }
}

/// A level in whole thousandths, as stores report it. Lua: `math.floor(l * 1000)`.
pub fn to_milli(level: f64) -> i64 {
    (level * 1000.0).floor() as i64
}

/// Back from thousandths to a level.
pub fn from_milli(milli: i64) -> f64 {
    milli as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpm(limit: u64) -> BucketSpec {
        BucketSpec {
            level: Level::User,
            dimension: Dimension::Tokens,
            limit,
            period_secs: 60,
            group: 0,
            window: None,
            alert_at: Default::default(),
        }
    }

    #[test]
    fn refill_is_continuous_and_capped() {
        let b = tpm(600);
        assert_eq!(b.refill(0.0, 1_000_000), 10.0);
        assert_eq!(b.refill(0.0, 100_000), 1.0);
        assert_eq!(b.refill(595.0, 60_000_000), 600.0);
        assert_eq!(b.refill(5.0, -3), 5.0, "a clock step back refills nothing");
    }

    #[test]
    fn debt_is_kept_and_surplus_capped() {
        let b = tpm(600);
        assert_eq!(b.settle(100.0, 300.0), -200.0);
        assert_eq!(b.settle(500.0, -300.0), 600.0);
        assert_eq!(b.settle(700.0, 50.0), 650.0, "an overage never caps");
        assert_eq!(b.until_full_us(-600.0), 120_000_000);
    }

    #[test]
    fn a_change_of_limit_keeps_what_was_used() {
        let pro = tpm(1000);
        assert_eq!(
            pro.rebase(300.0, 400.0),
            900.0,
            "100 used of 400: 900 of 1000 left"
        );
        assert_eq!(pro.rebase(400.0, 400.0), 1000.0, "nothing used: full");
        assert_eq!(pro.rebase(-50.0, 400.0), 550.0, "debt counts as used");
        let free = tpm(100);
        assert_eq!(
            free.rebase(350.0, 400.0),
            50.0,
            "50 used of 400: 50 of 100 left"
        );
        assert_eq!(
            free.rebase(200.0, 400.0),
            -100.0,
            "200 used: 100 owed, not forgiven"
        );
        assert_eq!(free.rebase(-20.0, 400.0), -320.0, "debt stays owed");
        // Down and back up again: nothing is lost either way.
        assert_eq!(pro.rebase(free.rebase(200.0, 400.0), 100.0), 800.0);
        assert_eq!(free.rebase(70.0, 0.0), 70.0, "an unknown limit: as stored");
        assert_eq!(free.rebase(70.0, 100.0), 70.0);
    }

    #[test]
    fn milli_floors_toward_minus_infinity() {
        assert_eq!(to_milli(-0.0005), -1);
        assert_eq!(to_milli(1.9999), 1999);
        assert_eq!(from_milli(-1500), -1.5);
    }
}
