//! Money: prices per model group and what a request costs, in integer
//! micro-dollars (µ$) everywhere, so sums never drift.
//!
//! A price is µ$ per million tokens (USD per million × 10⁶, exact for prices
//! given to six decimals). A cost is `ceil(Σ tokens × price / 10⁶)` µ$: the
//! products are summed exactly (integers) and rounded up once, so a request
//! never costs less than its tokens at list price, and by less than one µ$
//! more.

use super::tier::LimitsError;
pub use super::tier::MAX_SPEND_MICROS;

/// The most a price may be: $1,000,000 per million tokens.
pub const MAX_PRICE_MICROS: u64 = 1_000_000_000_000;

/// One model group's prices, µ$ per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// Prompt tokens.
    pub input: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached_input: u64,
    /// Output tokens.
    pub output: u64,
}

impl Price {
    /// What a reservation of `prompt` and `output` tokens may cost at most
    /// (every prompt token at the uncached price), µ$: the reservation's
    /// spend as every store computes it ([`SpendRates::spend`]).
    pub fn worst_case(&self, prompt: u64, output: u64) -> u64 {
        SpendRates::new(*self, prompt).spend(output as f64) as u64
    }

    /// What the usage cost, µ$: `cached` of the `prompt` tokens at the cached
    /// price.
    pub fn actual(&self, prompt: u64, cached: u64, completion: u64) -> u64 {
        let cached = cached.min(prompt);
        ceil_micros(
            u128::from(prompt - cached) * u128::from(self.input)
                + u128::from(cached) * u128::from(self.cached_input)
                + u128::from(completion) * u128::from(self.output),
        )
    }

    /// Checks each price; `path` names the section in errors.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        for (name, v) in [
            ("input", self.input),
            ("cached_input", self.cached_input),
            ("output", self.output),
        ] {
            if v > MAX_PRICE_MICROS {
                return Err(LimitsError::new(
                    format!("{path}.{name}"),
                    "at most 1000000 USD per million tokens",
                ));
            }
        }
        Ok(())
    }
}

/// What a reservation's spend is made of, in the doubles the stores and
/// their scripts compute with: the prompt at the input price (tokens × µ$
/// per million: `sp` in the scripts) and the output price (µ$ per million:
/// `op`). Exact while tokens × price stays below 2⁵³ (any real price).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpendRates {
    /// The prompt at the input price, µ$ × 10⁶.
    pub prompt: f64,
    /// The output price, µ$ per million tokens.
    pub output: f64,
}

impl SpendRates {
    /// The rates of `prompt` tokens and any output at `price`.
    pub fn new(price: Price, prompt: u64) -> Self {
        SpendRates {
            prompt: prompt as f64 * price.input as f64,
            output: price.output as f64,
        }
    }

    /// What the prompt and `output` tokens cost, µ$, rounded up once: the
    /// one spend rule of a reservation (Lua: `lua/splice/reservation_spend.lua`).
    pub fn spend(&self, output: f64) -> f64 {
        ((self.prompt + output * self.output) / 1e6).ceil()
    }

    /// The most output tokens that `left` µ$ pay for beside the prompt
    /// (whole µ$ only), or `None` when output is free.
    pub fn output_within(&self, left: f64) -> Option<f64> {
        (self.output > 0.0).then(|| ((left.floor() * 1e6 - self.prompt) / self.output).floor())
    }
}

/// A sum of tokens × (µ$ per million tokens), in µ$, rounded up.
fn ceil_micros(micro_micros: u128) -> u64 {
    u64::try_from(micro_micros.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// USD as written (`2.50`) to µ$, refusing what is not a price: negative,
/// not a number, or finer than a µ$.
pub fn usd_to_micros(field: &str, usd: f64, max: u64) -> Result<u64, LimitsError> {
    let micros = usd * 1e6;
    if !usd.is_finite() || usd < 0.0 || micros > max as f64 {
        return Err(LimitsError::new(
            field,
            format!(
                "{usd} is not an amount of USD between 0 and {}",
                max as f64 / 1e6
            ),
        ));
    }
    let rounded = micros.round();
    if (micros - rounded).abs() > 1e-6 * micros.max(1.0) {
        return Err(LimitsError::new(
            field,
            format!("{usd} has more than six decimals: amounts are whole micro-dollars"),
        ));
    }
    Ok(rounded as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt_4o() -> Price {
        Price {
            input: 2_500_000,
            cached_input: 1_250_000,
            output: 10_000_000,
        }
    }

    #[test]
    fn costs_are_exact_micro_dollars_rounded_up_once() {
        let p = gpt_4o();
        // 10,000 prompt tokens at $2.50/M = $0.025; 5,000 output at $10/M = $0.05.
        assert_eq!(p.worst_case(10_000, 5_000), 75_000);
        assert_eq!(p.actual(10_000, 4_000, 1_000), 15_000 + 5_000 + 10_000);
        // One token at $2.50/M is 2.5 µ$: rounded up to 3, once per request.
        assert_eq!(p.worst_case(1, 0), 3);
        assert_eq!(p.actual(3, 0, 0), 8);
        assert_eq!(Price::default().worst_case(1 << 40, 1 << 40), 0);
    }

    #[test]
    fn usd_amounts_become_whole_micro_dollars() {
        assert_eq!(usd_to_micros("p", 2.5, MAX_PRICE_MICROS), Ok(2_500_000));
        assert_eq!(usd_to_micros("p", 0.15, MAX_PRICE_MICROS), Ok(150_000));
        assert_eq!(usd_to_micros("p", 1.0, MAX_SPEND_MICROS), Ok(1_000_000));
        assert!(usd_to_micros("p", -1.0, MAX_PRICE_MICROS).is_err());
        assert!(usd_to_micros("p", 0.0000001, MAX_PRICE_MICROS).is_err());
        assert!(usd_to_micros("p", f64::NAN, MAX_PRICE_MICROS).is_err());
    }
}
