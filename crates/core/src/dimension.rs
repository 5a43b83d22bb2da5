//! What a limit counts, as data: the one list of dimensions, what each is
//! called where (configuration, metrics, the scripts' bucket ids) and what
//! kind of amount it is, and [`DimMap`], a value per rate dimension — the
//! type limits, overrides, costs, usage and statuses are indexed by.
//!
//! A new dimension is one entry here (and its proto names, `api/convert.rs`):
//! the configuration reads `<name> = [{ limit, period }]` at every level and
//! override, the plan sends its cost in the scripts' cost vector
//! (`cost[code]`), settle moves it by used − reserved, and statuses, the CLI
//! and the console list it. What really differs between dimensions stays in
//! one place each: the output a reservation is granted counts in
//! [`Dimension::counts_output`] dimensions; spend is priced
//! ([`Dimension::is_priced`]); a [`Dimension::is_declared`] dimension is
//! counted by the caller, per call (images), and kept on the reservation's
//! record; concurrency is a lease, not a bucket.
//!
//! This file is compiled twice — as part of the crate and inside `build.rs`
//! (which writes each dimension's code into the scripts' prelude) — so it
//! imports nothing.

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dimension {
    /// Requests; each reservation costs one.
    Requests,
    /// Tokens; each reservation costs prompt + output tokens.
    Tokens,
    /// Prompt tokens alone (Anthropic's input tokens per minute); cached
    /// prompt tokens are left out at Commit where a model group says so.
    InputTokens,
    /// Output tokens alone: the output reserved, then the completion.
    OutputTokens,
    /// Money, in micro-dollars: what requests cost at their model group's price.
    Spend,
    /// Images a call may generate (OpenAI's images per minute): the caller
    /// says how many at CheckAndReserve and how many were made at Commit.
    Images,
    /// Requests in flight at once.
    Concurrency,
}

/// How many rate dimensions there are: the width of a [`DimMap`] and of the
/// scripts' cost vectors.
pub const RATE_COUNT: usize = 6;

impl Dimension {
    /// The rate dimensions, in the order a level's buckets are planned: the
    /// slots of a [`DimMap`], and (one up) the code of each in a bucket id.
    pub const RATES: [Dimension; RATE_COUNT] = [
        Dimension::Requests,
        Dimension::Tokens,
        Dimension::InputTokens,
        Dimension::OutputTokens,
        Dimension::Spend,
        Dimension::Images,
    ];

    /// Lower-case name for configuration keys, messages and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dimension::Requests => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input_tokens",
            Dimension::OutputTokens => "output_tokens",
            Dimension::Spend => "spend",
            Dimension::Images => "images",
            Dimension::Concurrency => "concurrency",
        }
    }

    /// What it counts, for sentences ("… 500 of 1000 tokens").
    pub const fn unit(self) -> &'static str {
        match self {
            Dimension::Requests | Dimension::Concurrency => "requests",
            Dimension::Tokens => "tokens",
            Dimension::InputTokens => "input tokens",
            Dimension::OutputTokens => "output tokens",
            Dimension::Spend => "µ$",
            Dimension::Images => "images",
        }
    }

    /// Its limit's name, for sentences ("the tenant output-token limit").
    pub const fn limit_noun(self) -> &'static str {
        match self {
            Dimension::Requests => "request",
            Dimension::Tokens => "token",
            Dimension::InputTokens => "input-token",
            Dimension::OutputTokens => "output-token",
            Dimension::Spend => "spend",
            Dimension::Images => "image",
            Dimension::Concurrency => "concurrency",
        }
    }

    /// The name the scripts know the dimension's code by (build.rs writes
    /// `local <name> = <code>` into their prelude).
    pub const fn lua_name(self) -> &'static str {
        match self {
            Dimension::Requests => "REQUESTS",
            Dimension::Tokens => "TOKENS",
            Dimension::InputTokens => "INPUT",
            Dimension::OutputTokens => "OUTPUT",
            Dimension::Spend => "SPEND",
            Dimension::Images => "IMAGES",
            Dimension::Concurrency => "CONCURRENCY",
        }
    }

    /// Where a rate dimension sits in a [`DimMap`] (concurrency: none).
    pub const fn slot(self) -> Option<usize> {
        match self {
            Dimension::Concurrency => None,
            d => Some(d as usize),
        }
    }

    /// The dimension's digit in a bucket id, and its 1-based place in the
    /// scripts' cost vectors: 1 requests … 6 images. Concurrency shares the
    /// requests' (a lease takes one request's slot).
    pub const fn code(self) -> usize {
        match self.slot() {
            Some(slot) => slot + 1,
            None => 1,
        }
    }

    /// The rate dimension of a bucket id's digit.
    pub fn from_code(code: usize) -> Option<Dimension> {
        code.checked_sub(1)
            .and_then(|slot| Dimension::RATES.get(slot))
            .copied()
    }

    /// True where a reservation's output counts: tokens, output tokens and
    /// spend. A level holds output (the grant, or the learned output) only
    /// in buckets of these; one with none holds no output at all.
    pub const fn counts_output(self) -> bool {
        matches!(
            self,
            Dimension::Tokens | Dimension::OutputTokens | Dimension::Spend
        )
    }

    /// True for the three kinds of token limit.
    pub const fn is_tokens(self) -> bool {
        matches!(
            self,
            Dimension::Tokens | Dimension::InputTokens | Dimension::OutputTokens
        )
    }

    /// True for money: limits written in USD (`limit_usd`), counted in µ$.
    pub const fn is_priced(self) -> bool {
        matches!(self, Dimension::Spend)
    }

    /// True where the caller counts what a call uses (images): it says at
    /// CheckAndReserve how many a call may use, which the reservation's
    /// record keeps, and at Commit how many it used.
    pub const fn is_declared(self) -> bool {
        matches!(self, Dimension::Images)
    }
}

/// A value per rate dimension, in [`Dimension::RATES`] order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DimMap<T>(pub [T; RATE_COUNT]);

impl<T> DimMap<T> {
    /// A map of `f(dimension)` for every rate dimension.
    pub fn from_fn(mut f: impl FnMut(Dimension) -> T) -> Self {
        DimMap(Dimension::RATES.map(&mut f))
    }

    /// Each rate dimension with its value.
    pub fn iter(&self) -> impl Iterator<Item = (Dimension, &T)> {
        Dimension::RATES.into_iter().zip(self.0.iter())
    }

    /// A map of `f(dimension, value)`.
    pub fn map<U>(&self, mut f: impl FnMut(Dimension, &T) -> U) -> DimMap<U> {
        DimMap::from_fn(|d| f(d, &self[d]))
    }
}

impl<T: Default> DimMap<T> {
    /// A map of these values, every other dimension's the default.
    pub fn with<const N: usize>(values: [(Dimension, T); N]) -> Self {
        let mut map = DimMap::default();
        for (d, v) in values {
            map[d] = v;
        }
        map
    }
}

impl<T: Copy> DimMap<T> {
    /// The values of the declared dimensions, in order.
    pub fn declared(&self) -> &[T] {
        &self.0[DECLARED_FIRST - 1..]
    }
}

impl<T> std::ops::Index<Dimension> for DimMap<T> {
    type Output = T;

    /// The value of a rate dimension (concurrency has none: a bug to ask).
    fn index(&self, dimension: Dimension) -> &T {
        &self.0[dimension.slot().expect("a rate dimension")]
    }
}

impl<T> std::ops::IndexMut<Dimension> for DimMap<T> {
    fn index_mut(&mut self, dimension: Dimension) -> &mut T {
        &mut self.0[dimension.slot().expect("a rate dimension")]
    }
}

/// Most rates one level may define per dimension (keeps scripts short).
pub const MAX_RATES_PER_DIMENSION: usize = 8;

/// The most checks one plan can have: 4 levels × (every rate dimension × 2
/// (all models and one group) × [`MAX_RATES_PER_DIMENSION`] + a concurrency
/// limit) + 4 group slot limits. A denied reservation's mask has a bit for
/// each (`DeniedChecks`; the scripts send it as `DENIED_DOUBLES` doubles of
/// 32 bits).
pub const MAX_CHECKS: usize = 4 * (RATE_COUNT * 2 * MAX_RATES_PER_DIMENSION + 1) + 4;

/// How many dimensions the caller counts ([`Dimension::is_declared`]):
/// they come last in [`Dimension::RATES`], so their codes run from
/// [`DECLARED_FIRST`] to [`RATE_COUNT`].
pub const DECLARED_COUNT: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < RATE_COUNT {
        if Dimension::RATES[i].is_declared() {
            n += 1;
        }
        i += 1;
    }
    n
};

/// The code of the first declared dimension (`RATE_COUNT + 1`: none).
pub const DECLARED_FIRST: usize = RATE_COUNT - DECLARED_COUNT + 1;

const _: () = {
    let mut i = 0;
    while i < RATE_COUNT {
        assert!(
            Dimension::RATES[i] as usize == i,
            "RATES is in declaration order"
        );
        i += 1;
    }
    assert!(
        Dimension::Concurrency as usize == RATE_COUNT,
        "concurrency is last"
    );
    let mut i = DECLARED_FIRST - 1;
    while i < RATE_COUNT {
        assert!(
            Dimension::RATES[i].is_declared(),
            "declared dimensions come last"
        );
        i += 1;
    }
};
