//! The synthetic workload: who calls, on which tier, with how large a prompt, how
//! long the upstream takes, and whether the call is committed or refunded.
//! Defaults resemble an LLM gateway: a few tenants and users do most of the
//! traffic (Zipf), most prompts are short, and a long tail is 32K–128K tokens.

use crate::pb;
use rand::Rng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, LogNormal, Zipf};
use std::time::Duration;

/// What the workload looks like; every field is a `ctxbudget bench` flag.
#[derive(Clone, Debug, clap::Args, serde::Serialize)]
pub struct WorkloadArgs {
    /// Tenants, drawn with a Zipf skew.
    #[arg(long, default_value_t = 200)]
    pub tenants: u32,
    /// Users per tenant, drawn with a Zipf skew.
    #[arg(long, default_value_t = 50)]
    pub users: u32,
    /// Zipf exponent of tenant and user popularity (0 = uniform).
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Tier mix of tenants, `name:weight,...`.
    #[arg(long, default_value = "free:60,pro:30,enterprise:10")]
    pub tier_mix: String,
    /// Median prompt size of ordinary requests, in tokens (log-normal).
    #[arg(long, default_value_t = 600)]
    pub prompt_median: u64,
    /// Share of requests with a long prompt (uniform in --long-min..--long-max).
    #[arg(long, default_value_t = 0.02)]
    pub long_share: f64,
    /// Shortest long prompt, in tokens.
    #[arg(long, default_value_t = 32_000)]
    pub long_min: u64,
    /// Longest long prompt, in tokens.
    #[arg(long, default_value_t = 128_000)]
    pub long_max: u64,
    /// `max_output_tokens` of every request; the simulated answer uses
    /// --output-min-share to --output-max-share of it (uniform).
    #[arg(long, default_value_t = 512)]
    pub max_output: u64,
    /// The least share of `max_output_tokens` a simulated answer uses.
    #[arg(long, default_value_t = 0.2)]
    pub output_min_share: f64,
    /// The largest share of `max_output_tokens` a simulated answer uses.
    #[arg(long, default_value_t = 1.0)]
    pub output_max_share: f64,
    /// Mean simulated upstream time between reserve and settle, in ms (uniform
    /// 0.5×–1.5× this).
    #[arg(long, default_value_t = 300)]
    pub upstream_ms: u64,
    /// Share of allowed calls that fail upstream and are refunded.
    #[arg(long, default_value_t = 0.05)]
    pub refund_share: f64,
    /// Random seed: the same seed replays the same request sequence per worker.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Send each prompt as text for the service to count (`word ` as many
    /// times as its size), not as its count: CheckAndReserve's `prompt`
    /// (`--api ext_proc` always sends text).
    #[arg(long)]
    pub prompt_as_text: bool,
}

/// The model every bench request names: a model group matching it adds its
/// limits to the run (and to the overspend check).
pub const BENCH_MODEL: &str = "bench";

/// The answer to one reservation, whichever way it travelled.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Allowed or not.
    pub allowed: bool,
    /// `allowed` or the denial reason, as in metrics.
    pub reason: &'static str,
    /// The reservation to settle.
    pub reservation_id: String,
    /// The output tokens the service reserved (the most any level holds):
    /// less than `max_output` where every level holds the learned output.
    pub reserved_output: u64,
}

/// One request of the workload and what its upstream call will do.
#[derive(Clone, Debug)]
pub struct Item {
    /// Tenant index.
    pub tenant: u32,
    /// User index within the tenant.
    pub user: u32,
    /// Index into [`Workload::tiers`].
    pub tier: usize,
    /// Prompt tokens (the caller's count).
    pub prompt: u64,
    /// `max_output_tokens`.
    pub max_output: u64,
    /// Output tokens the simulated upstream produces.
    pub completion: u64,
    /// Simulated upstream time.
    pub upstream: Duration,
    /// The upstream call fails: refund instead of commit.
    pub refund: bool,
    /// The prompt goes as text ([`Item::prompt_text`]), not as its count.
    pub prompt_as_text: bool,
}

impl Item {
    /// The tenant id sent to the service.
    pub fn tenant_id(&self) -> String {
        format!("t{}", self.tenant)
    }

    /// The user id sent to the service.
    pub fn user_id(&self) -> String {
        format!("u{}", self.user)
    }

    /// The prompt as text: `word ` as many times as its size (one token
    /// each in OpenAI's encodings).
    pub fn prompt_text(&self) -> String {
        "word ".repeat(usize::try_from(self.prompt).unwrap_or(1 << 20).min(1 << 20))
    }
}

/// A workload ready to draw from.
#[derive(Clone, Debug)]
pub struct Workload {
    args: WorkloadArgs,
    /// Tier names, in mix order.
    pub tiers: Vec<String>,
    tenant_tier: Vec<usize>,
    tenants: Zipf<f64>,
    users: Zipf<f64>,
    prompt: LogNormal<f64>,
}

impl Workload {
    /// Validates the arguments and precomputes each tenant's tier.
    pub fn new(args: WorkloadArgs) -> Result<Self, String> {
        let mut tiers = Vec::new();
        let mut weights = Vec::new();
        for part in args.tier_mix.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, weight) = part
                .split_once(':')
                .ok_or_else(|| format!("--tier-mix: {part:?} is not name:weight"))?;
            let weight: f64 = weight
                .trim()
                .parse()
                .map_err(|_| format!("--tier-mix: weight {weight:?} is not a number"))?;
            tiers.push(name.trim().to_string());
            weights.push(weight.max(0.0));
        }
        let total: f64 = weights.iter().sum();
        if tiers.is_empty() || total <= 0.0 {
            return Err("--tier-mix needs at least one tier with a positive weight".into());
        }
        if args.tenants == 0 || args.users == 0 {
            return Err("--tenants and --users must be at least 1".into());
        }
        if args.long_min > args.long_max {
            return Err("--long-min must not exceed --long-max".into());
        }
        if !(0.0 <= args.output_min_share
            && args.output_min_share <= args.output_max_share
            && args.output_max_share <= 1.0)
        {
            return Err(
                "--output-min-share and --output-max-share are shares of --max-output:                  0 ≤ min ≤ max ≤ 1"
                    .into(),
            );
        }
        // Tenant i gets the tier whose cumulative weight covers (i * φ) mod 1:
        // deterministic, evenly spread over popular and rare tenants.
        let tenant_tier = (0..args.tenants)
            .map(|i| {
                let u = (f64::from(i) * 0.618_033_988_75).fract() * total;
                let mut acc = 0.0;
                weights
                    .iter()
                    .position(|w| {
                        acc += w;
                        u < acc
                    })
                    .unwrap_or(tiers.len() - 1)
            })
            .collect();
        let zipf = |n: u32| Zipf::new(f64::from(n), args.zipf).map_err(|e| format!("--zipf: {e}"));
        let prompt = LogNormal::new((args.prompt_median.max(1) as f64).ln(), 1.0)
            .map_err(|e| format!("--prompt-median: {e}"))?;
        Ok(Workload {
            tenants: zipf(args.tenants)?,
            users: zipf(args.users)?,
            prompt,
            tiers,
            tenant_tier,
            args,
        })
    }

    /// The arguments this workload was built from.
    pub fn args(&self) -> &WorkloadArgs {
        &self.args
    }

    /// Draws the next request.
    pub fn next(&self, rng: &mut SmallRng) -> Item {
        let tenant = self.tenants.sample(rng) as u32 - 1;
        let user = self.users.sample(rng) as u32 - 1;
        let prompt = if rng.random_bool(self.args.long_share.clamp(0.0, 1.0)) {
            rng.random_range(self.args.long_min..=self.args.long_max)
        } else {
            (self.prompt.sample(rng) as u64).clamp(8, 16_000)
        };
        let max_output = self.args.max_output;
        let (lo, hi) = (self.args.output_min_share, self.args.output_max_share);
        let completion = (max_output as f64 * rng.random_range(lo..=hi)) as u64;
        let upstream_ms = self.args.upstream_ms as f64 * rng.random_range(0.5..=1.5);
        Item {
            tenant,
            user,
            tier: self.tenant_tier[tenant as usize],
            prompt,
            max_output,
            completion,
            upstream: Duration::from_secs_f64(upstream_ms / 1000.0),
            refund: rng.random_bool(self.args.refund_share.clamp(0.0, 1.0)),
            prompt_as_text: self.args.prompt_as_text,
        }
    }
}

impl Item {
    /// The CheckAndReserve request of this item on `tier`, as the budget
    /// API takes it (over gRPC or HTTP).
    pub fn reserve_request(&self, tier: &str) -> pb::CheckAndReserveRequest {
        pb::CheckAndReserveRequest {
            tenant_id: self.tenant_id(),
            user_id: self.user_id(),
            tier: tier.to_string(),
            model: BENCH_MODEL.into(),
            prompt_tokens: (!self.prompt_as_text).then_some(self.prompt),
            prompt: match self.prompt_as_text {
                true => self.prompt_text(),
                false => String::new(),
            },
            max_output_tokens: self.max_output,
            ..Default::default()
        }
    }
}

/// A denial reason of the API, as metrics name it.
pub(super) fn pb_reason_name(r: pb::Reason) -> &'static str {
    crate::api::reason_of(r).map_or("allowed", crate::domain::Reason::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use rand::SeedableRng;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        w: WorkloadArgs,
    }

    #[test]
    fn defaults_look_like_a_gateway() {
        let w = Workload::new(Args::parse_from(["x"]).w).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let items: Vec<Item> = (0..20_000).map(|_| w.next(&mut rng)).collect();
        let long = items.iter().filter(|i| i.prompt >= 32_000).count() as f64 / 20_000.0;
        assert!((0.01..0.03).contains(&long), "long tail share {long}");
        let top = items.iter().filter(|i| i.tenant == 0).count() as f64 / 20_000.0;
        assert!(top > 0.1, "Zipf makes tenant 0 popular: {top}");
        let mut short: Vec<u64> = items
            .iter()
            .filter(|i| i.prompt < 32_000)
            .map(|i| i.prompt)
            .collect();
        short.sort_unstable();
        let median = short[short.len() / 2];
        assert!((450..800).contains(&median), "median prompt {median}");
        assert!(items.iter().all(|i| i.completion <= i.max_output));
    }

    #[test]
    fn bad_mixes_are_refused() {
        let mut a = Args::parse_from(["x"]).w;
        a.tier_mix = "free".into();
        assert!(Workload::new(a.clone()).is_err());
        a.tier_mix = "free:0".into();
        assert!(Workload::new(a).is_err());
    }
}
