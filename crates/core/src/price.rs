//! Money: prices per model group and what a request costs, in integer
//! micro-dollars (µ$) everywhere, so sums never drift.
//!
//! A price is µ$ per million tokens (USD per million × 10⁶, exact for prices
//! given to six decimals). A cost is `ceil(Σ tokens × price / 10⁶)` µ$: the
//! products are summed exactly (integers) and rounded up once, so a request
//! never costs less than its tokens at list price, and by less than one µ$
//! more.
//!
//! As providers bill: a prompt is its uncached part at the input price, its
//! cache reads and its cache writes (5-minute and 1-hour) each at their own;
//! a completion its visible part at the output price and its reasoning part
//! at the reasoning price; a call may carry a flat fee; and a prompt past a
//! long-context threshold prices the whole call at that tier's rates.

use super::level::DimMap;
use super::tier::LimitsError;
pub use super::tier::MAX_SPEND_MICROS;

/// The most a price may be: $1,000,000 per million tokens.
pub const MAX_PRICE_MICROS: u64 = 1_000_000_000_000;

/// One model group's prices at one prompt size, µ$ per million tokens (the
/// flat fee µ$ per call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rates {
    /// Prompt tokens.
    pub input: u64,
    /// Prompt tokens read from the provider's cache.
    pub cached_input: u64,
    /// Prompt tokens written to the provider's cache for 5 minutes.
    pub cache_write: u64,
    /// Prompt tokens written to the provider's cache for an hour.
    pub cache_write_1h: u64,
    /// Output tokens.
    pub output: u64,
    /// Reasoning tokens (part of the output).
    pub reasoning: u64,
    /// Per call, µ$ (not per million).
    pub per_call: u64,
    /// Per unit of each dimension the caller counts (an image), µ$ (not
    /// per million); 0 elsewhere.
    pub declared: DimMap<u64>,
}

impl Rates {
    /// Flat rates: every prompt token at `input`, every output token at
    /// `output`, no fee.
    pub fn flat(input: u64, output: u64) -> Self {
        Rates {
            input,
            cached_input: input,
            cache_write: input,
            cache_write_1h: input,
            output,
            reasoning: output,
            per_call: 0,
            declared: DimMap::default(),
        }
    }

    /// The most an output token may cost: visible or reasoning.
    fn output_at_most(&self) -> u64 {
        self.output.max(self.reasoning)
    }

    /// What `prompt` and `output` tokens may cost at most at these rates, µ$
    /// (see [`Price::worst_case`]).
    pub fn worst_case(&self, prompt: u64, output: u64) -> u64 {
        SpendRates::new(*self, prompt).spend(output as f64) as u64
    }
}

/// One model group's prices: its rates, and the rates of each long-context
/// tier, by the prompt size above which it prices the whole call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Price {
    /// The rates of a prompt at or below every tier's threshold.
    pub base: Rates,
    /// (prompt tokens, rates): a prompt above the threshold is priced at
    /// those rates, the whole call; thresholds ascending.
    pub above: Vec<(u64, Rates)>,
}

/// What a call used, as providers report it: the parts of the prompt and of
/// the completion priced apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    /// Prompt tokens, every part included.
    pub prompt: u64,
    /// Of `prompt`, read from the provider's cache.
    pub cached: u64,
    /// Of `prompt`, written to the cache for 5 minutes.
    pub cache_write: u64,
    /// Of `prompt`, written to the cache for an hour.
    pub cache_write_1h: u64,
    /// Completion tokens, reasoning included.
    pub completion: u64,
    /// Of `completion`, reasoning.
    pub reasoning: u64,
    /// What the call used in each dimension the caller counts (images).
    pub declared: DimMap<u64>,
}

impl Price {
    /// Flat prices, no tier: see [`Rates::flat`].
    pub fn flat(input: u64, output: u64) -> Self {
        Price {
            base: Rates::flat(input, output),
            above: Vec::new(),
        }
    }

    /// The rates of a call whose prompt is `prompt` tokens: those of the
    /// highest tier whose threshold it passes, else the base.
    pub fn at(&self, prompt: u64) -> Rates {
        self.above
            .iter()
            .rev()
            .find(|(threshold, _)| prompt > *threshold)
            .map_or(self.base, |(_, r)| *r)
    }

    /// What a reservation of `prompt` and `output` tokens holds: every prompt
    /// token at the input price of its tier (cache writes dearer than input
    /// are charged at Commit, as tokens above a reservation are), every
    /// output token at the dearer of output and reasoning, the fee, µ$: the
    /// reservation's spend as every store computes it ([`SpendRates::spend`]).
    pub fn worst_case(&self, prompt: u64, output: u64) -> u64 {
        self.at(prompt).worst_case(prompt, output)
    }

    /// What a call cost, µ$, at the tier its prompt reached; each part at its
    /// price (parts beyond the whole are capped, so never negative).
    pub fn actual(&self, used: Billed) -> u64 {
        let r = self.at(used.prompt);
        let cached = used.cached.min(used.prompt);
        let write = used.cache_write.min(used.prompt - cached);
        let write_1h = used.cache_write_1h.min(used.prompt - cached - write);
        let reasoning = used.reasoning.min(used.completion);
        let times = |tokens: u64, price: u64| u128::from(tokens) * u128::from(price);
        ceil_micros(
            times(used.prompt - cached - write - write_1h, r.input)
                + times(cached, r.cached_input)
                + times(write, r.cache_write)
                + times(write_1h, r.cache_write_1h)
                + times(used.completion - reasoning, r.output)
                + times(reasoning, r.reasoning)
                + times(r.per_call, 1_000_000)
                + used
                    .declared
                    .iter()
                    .map(|(d, &n)| times(n, r.declared[d]) * 1_000_000)
                    .sum::<u128>(),
        )
    }

    /// Checks each price and that thresholds ascend; `path` names the
    /// section in errors.
    pub fn validate(&self, path: &str) -> Result<(), LimitsError> {
        let tiers = self.above.iter().enumerate();
        let all = std::iter::once((path.to_owned(), &self.base))
            .chain(tiers.map(|(i, (_, r))| (format!("{path}.above[{i}]"), r)));
        for (at, r) in all {
            for (name, v) in [
                ("input", r.input),
                ("cached_input", r.cached_input),
                ("cache_write", r.cache_write),
                ("cache_write_1h", r.cache_write_1h),
                ("output", r.output),
                ("reasoning", r.reasoning),
            ] {
                if v > MAX_PRICE_MICROS {
                    return Err(LimitsError::new(
                        format!("{at}.{name}"),
                        "at most 1000000 USD per million tokens",
                    ));
                }
            }
            if r.per_call > MAX_PRICE_MICROS {
                return Err(LimitsError::new(
                    format!("{at}.per_call"),
                    "at most 1000000 USD per call",
                ));
            }
        }
        for (i, pair) in self.above.windows(2).enumerate() {
            if pair[1].0 <= pair[0].0 {
                return Err(LimitsError::new(
                    format!("{path}.above[{}].prompt_tokens", i + 1),
                    format!(
                        "{} is not above the tier before it ({}): list tiers by ascending \
                         prompt_tokens",
                        pair[1].0, pair[0].0
                    ),
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
    /// The prompt at the input price and the call's fee, µ$ × 10⁶.
    pub prompt: f64,
    /// The output price, µ$ per million tokens.
    pub output: f64,
}

impl SpendRates {
    /// The rates of `prompt` tokens (and the call's fee) and any output at
    /// `rates` (an output token at the dearer of output and reasoning).
    pub fn new(rates: Rates, prompt: u64) -> Self {
        SpendRates {
            prompt: prompt as f64 * rates.input as f64 + rates.per_call as f64 * 1e6,
            output: rates.output_at_most() as f64,
        }
    }

    /// These rates with what `declared` costs at `rates` added to the
    /// prompt's part (a fee per image, as the call's fee).
    pub fn with_declared(mut self, rates: &Rates, declared: &DimMap<u64>) -> Self {
        for (d, &n) in declared.iter().filter(|(_, n)| **n != 0) {
            self.prompt += n as f64 * rates.declared[d] as f64 * 1e6;
        }
        self
    }

    /// What the prompt and `output` tokens cost, µ$, rounded up once: the
    /// one spend rule of a reservation (Lua: `crates/store/lua/splice/reservation_spend.lua`).
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
            base: Rates {
                cached_input: 1_250_000,
                ..Rates::flat(2_500_000, 10_000_000)
            },
            above: Vec::new(),
        }
    }

    fn used(prompt: u64, cached: u64, completion: u64) -> Billed {
        Billed {
            prompt,
            cached,
            completion,
            ..Billed::default()
        }
    }

    #[test]
    fn costs_are_exact_micro_dollars_rounded_up_once() {
        let p = gpt_4o();
        // 10,000 prompt tokens at $2.50/M = $0.025; 5,000 output at $10/M = $0.05.
        assert_eq!(p.worst_case(10_000, 5_000), 75_000);
        assert_eq!(
            p.actual(used(10_000, 4_000, 1_000)),
            15_000 + 5_000 + 10_000
        );
        // One token at $2.50/M is 2.5 µ$: rounded up to 3, once per request.
        assert_eq!(p.worst_case(1, 0), 3);
        assert_eq!(p.actual(used(3, 0, 0)), 8);
        assert_eq!(Price::default().worst_case(1 << 40, 1 << 40), 0);
    }

    /// Claude Sonnet's way: above 200K prompt tokens the whole call at the
    /// long-context rates; cache writes at 1.25× and 2× the input price; a
    /// web search at $0.01 a call; reasoning at the output price.
    #[test]
    fn calls_are_priced_as_providers_bill_them() {
        let base = Rates {
            cached_input: 300_000,
            cache_write: 3_750_000,
            cache_write_1h: 6_000_000,
            per_call: 10_000,
            ..Rates::flat(3_000_000, 15_000_000)
        };
        let long = Rates {
            cached_input: 600_000,
            cache_write: 7_500_000,
            cache_write_1h: 12_000_000,
            ..Rates::flat(6_000_000, 22_500_000)
        };
        let p = Price {
            base,
            above: vec![(
                200_000,
                Rates {
                    per_call: 10_000,
                    ..long
                },
            )],
        };
        assert_eq!(p.at(200_000), base, "at the threshold: the base");
        assert_eq!(p.at(200_001).input, 6_000_000, "above it: the tier");
        // 100,000 prompt tokens: 10,000 read, 20,000 written for 5 min, 30,000
        // for an hour, 40,000 plain; 2,000 completion, 500 of them reasoning.
        let billed = Billed {
            prompt: 100_000,
            cached: 10_000,
            cache_write: 20_000,
            cache_write_1h: 30_000,
            declared: DimMap::default(),
            completion: 2_000,
            reasoning: 500,
        };
        let parts = 40_000 * 3 + 10_000 * 3 / 10 + 20_000 * 15 / 4 + 30_000 * 6;
        let cost = parts + 1_500 * 15 + 500 * 15 + 10_000;
        assert_eq!(p.actual(billed), cost);
        // The same call past 200K: every part at the long-context rate.
        let long_call = Billed {
            prompt: 250_000,
            ..billed
        };
        let long_parts = 190_000 * 6 + 10_000 * 6 / 10 + 20_000 * 15 / 2 + 30_000 * 12;
        assert_eq!(p.actual(long_call), long_parts + 2_000 * 45 / 2 + 10_000);
        // Reserved: the prompt at its tier's input price, the output at the
        // dearer of output and reasoning, the fee.
        assert_eq!(p.worst_case(250_000, 1_000), 1_500_000 + 22_500 + 10_000);
        assert_eq!(p.worst_case(100_000, 1_000), 300_000 + 15_000 + 10_000);
        let dear_reasoning = Price {
            base: Rates {
                reasoning: 60_000_000,
                ..base
            },
            above: Vec::new(),
        };
        assert_eq!(dear_reasoning.worst_case(0, 1_000), 60_000 + 10_000);
    }

    #[test]
    fn tiers_ascend() {
        let p = Price {
            base: Rates::flat(1, 1),
            above: vec![(200_000, Rates::flat(2, 2)), (100_000, Rates::flat(3, 3))],
        };
        let err = p.validate("prices.g").unwrap_err();
        assert_eq!(err.field, "prices.g.above[1].prompt_tokens");
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
