//! The reserve call: KEYS and ARGV for `lua/reserve.lua` from a plan, and its
//! reply as a [`ReserveReply`]; and fallback candidates' plans in one
//! `lua/reserve_first.lua` call.
//! The reply's tags and layout are the script's contract, in its header.

use super::RedisStore;
use super::wire::{
    Args, Call, Spec, denied_at, doubles, int_at, overrun, record_tail, retention_us, state_at,
    string_at, unexpected,
};
use crate::domain::budget::ledger::LedgerRetention;
use crate::domain::budget::reserve::{counts_reclaims, spend_rates};
use crate::domain::budget::state;
use crate::domain::layout::{
    BUCKET_WIDTH, RECLAIM_BITS, RECLAIM_CAP, REPLY_ALLOWED, REPLY_DENIED, REPLY_KEY_CONFLICT,
    REPLY_KEY_SPENT, REPLY_REPLAYED, STATE_HEAD,
};
use crate::domain::price::SpendRates;
use crate::domain::{Level, ReservePlan};
use crate::store::keys::{lease_field, ledger_fields};
use crate::store::{Reclaimed, ReserveReply, Scope, StoreError};
use redis::{ToRedisArgs, Value};

impl RedisStore {
    /// Takes the plan's cost at every level, or nothing.
    pub(super) async fn reserve_call(
        &self,
        plan: &ReservePlan,
    ) -> Result<ReserveReply, StoreError> {
        let mut inv = self.reserve.prepare_invoke();
        self.reserve_args(plan, &mut inv);
        let mut reply = self.run(&inv).await?;
        if self.keys.is_clustered() {
            self.index_crossing(&plan.id.tenant, &mut reply).await?;
        }
        decode_reserve(plan, &reply)
    }

    /// The first of `plans` with room, in one call: reserve.lua's KEYS and
    /// ARGV of each plan, one after the other (lua/reserve_first.lua). On a
    /// cluster layout, where plans' keys may lie in several slots, one call
    /// per plan.
    pub(super) async fn reserve_first_call(
        &self,
        plans: &[ReservePlan],
    ) -> Result<Vec<ReserveReply>, StoreError> {
        if plans.len() < 2 || self.keys.is_clustered() {
            return crate::store::one_by_one(self, plans).await;
        }
        let parts: Vec<Parts> = plans
            .iter()
            .map(|plan| {
                let mut parts = Parts::default();
                self.reserve_args(plan, &mut parts);
                parts
            })
            .collect();
        use super::spec::{reserve_first_argv as a, reserve_first_sizes as sizes};
        let mut inv = self.reserve_first.prepare_invoke();
        let mut args = Args::new(&mut inv);
        args.at(a::CANDIDATES, plans.len());
        for (i, p) in parts.iter().enumerate() {
            let at = a::WIDTH + i * sizes::WIDTH;
            args.at(at + sizes::KEYS, p.keys.len())
                .at(at + sizes::ARGS, p.args.len());
        }
        // Then each candidate's KEYS and ARGV, as reserve.lua takes them.
        let mut key = 0;
        for p in parts {
            for k in p.keys {
                args.key(key, k);
                key += 1;
            }
            for arg in &p.args {
                let at = args.next();
                args.at(at, arg.as_slice());
            }
        }
        let reply = self.run(&inv).await?;
        decode_first(plans, &reply)
    }

    /// KEYS: every level, the record, the idempotency key if any; ARGV: the
    /// plan as doubles, the lease field, TTLs, the record's tail and layouts.
    fn reserve_args(&self, plan: &ReservePlan, call: &mut impl Call) {
        use super::spec::reserve_keys as k;
        let id = &plan.id;
        let tenant = self.keys.of_tenant(&id.tenant);
        let n = plan.levels.len();
        let mut args = Args::new(call);
        for (i, lp) in plan.levels.iter().enumerate() {
            args.key(i, tenant.plan_level(lp, Scope::of(id)));
        }
        args.key(n + k::RECORD, tenant.record(id));
        let idem_ttl = match &plan.idempotency_key {
            Some(key) => {
                args.key(n + k::IDEMPOTENCY, tenant.idempotency(key));
                self.retention.idempotency_ms
            }
            None => 0,
        };
        use super::spec::{ledger_argv as ledger, reserve_argv as a};
        let alerts = self.alert_args(&plan.levels);
        let spec = reserve_spec(plan, self.retention.ledger);
        args.at(a::SPEC, &spec.0)
            .at(a::LEASE, lease_field(id))
            .at(
                a::RECORD_TTL_MS,
                plan.lease_ttl_ms + self.retention.record_ms,
            )
            .at(a::IDEMPOTENCY_TTL_MS, idem_ttl)
            .at(a::RECORD_TAIL, record_tail(plan))
            .at(a::SPEC_FORMAT, doubles(spec.count()).as_ref());
        // Then each level state's format.
        for (i, lp) in plan.levels.iter().enumerate() {
            let format = doubles(STATE_HEAD + BUCKET_WIDTH * lp.buckets.len());
            args.at(a::WIDTH + i, format.as_ref());
        }
        if self.retention.ledger.is_some() {
            let (hour, day) = ledger_fields(&id.group, id.user.as_ref());
            let at = args.next();
            args.at(at + ledger::PREFIX, tenant.ledger_base())
                .at(at + ledger::HOUR_FIELD, hour)
                .at(at + ledger::DAY_FIELD, day);
        }
        if let Some(spec) = &alerts {
            let at = args.next();
            args.at(at, &spec.0);
        }
        // Last, wherever the optional arguments before it end (`ARGV[#ARGV]`).
        let last = args.next();
        args.at(last, tenant.record_prefix());
    }
}

/// One plan's KEYS and ARGV, to be counted and joined to others'.
#[derive(Default)]
struct Parts {
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
}

impl Call for Parts {
    fn key(&mut self, key: String) {
        self.keys.push(key);
    }

    fn arg<T: ToRedisArgs>(&mut self, arg: T) {
        self.args.extend(arg.to_redis_args());
    }
}

/// The plan's numbers, where reserve.lua reads them (`calls::RESERVE`, then
/// per level `calls::RESERVE_LEVEL` and its buckets).
fn reserve_spec(plan: &ReservePlan, ledger: Option<LedgerRetention>) -> Spec {
    use super::spec::{reserve as h, reserve_level as l};
    let mut head = [0.0; h::WIDTH];
    head[h::LEVELS] = plan.levels.len() as f64;
    head[h::PROMPT] = plan.prompt_tokens as f64;
    head[h::MAX_OUTPUT] = plan.max_output_tokens as f64;
    head[h::MIN_OUTPUT] = plan.min_output_tokens as f64;
    head[h::LEASE_TTL_US] = plan.lease_ttl_ms as f64 * 1000.0;
    head[h::ESTIMATED] = plan.estimated_prompt_tokens as f64;
    head[h::HEADROOM] = plan.headroom;
    let SpendRates { prompt, output } = spend_rates(plan);
    head[h::PROMPT_SPEND] = prompt;
    head[h::OUTPUT_PRICE] = output;
    let (hourly, daily) = retention_us(ledger);
    head[h::HOURLY_RETENTION_US] = hourly;
    head[h::DAILY_RETENTION_US] = daily;
    // 0: no learned output (a level then holds the grant).
    head[h::LEARNED_OUTPUT] = plan.learned_output.map_or(0.0, |l| l as f64);
    let mut spec = Spec::default();
    spec.group(&head)
        .costs(&plan.cost_with(0).map(|_, &v| v as f64));
    for (i, lp) in plan.levels.iter().enumerate() {
        let mut level = [0.0; l::WIDTH];
        level[l::BUCKETS] = lp.buckets.len() as f64;
        level[l::CONCURRENCY] = lp.concurrency.map_or(-1.0, |c| c as f64);
        level[l::RECLAIM_WEIGHT] = match counts_reclaims(&plan.levels, i) {
            true => 2f64.powi((RECLAIM_BITS as usize * Reclaimed::index(lp.level)) as i32),
            false => 0.0,
        };
        let (capacity, refill_us) = overrun(lp);
        level[l::OVERRUN_CAPACITY] = capacity;
        level[l::OVERRUN_REFILL_US] = refill_us;
        level[l::BIT] = f64::from(lp.bit());
        level[l::MAX_LIFE_US] = lp.max_life_us();
        spec.group(&level).buckets(lp);
    }
    spec
}

/// reserve_first.lua's reply: each tried plan's reply, decoded as
/// reserve.lua's, checked against the candidate the script names.
fn decode_first(plans: &[ReservePlan], reply: &[Value]) -> Result<Vec<ReserveReply>, StoreError> {
    use super::spec::reserve_first_reply as r;
    let tried = int_at(reply, r::CHOSEN)?;
    let replies = reply.get(r::WIDTH..).unwrap_or_default();
    let well_formed = replies.len() <= plans.len()
        && (tried == 0 && replies.len() == plans.len() || tried == replies.len() as i64);
    if !well_formed {
        return Err(StoreError::Protocol(
            format!(
                "reserve_first script replied for {} of {} plans with {tried} chosen (is \
                 lua/reserve_first.lua out of step with this binary?)",
                replies.len(),
                plans.len()
            )
            .into(),
        ));
    }
    let replies = plans
        .iter()
        .zip(replies)
        .map(|(plan, reply)| match reply {
            Value::Array(values) => decode_reserve(plan, values),
            other => Err(StoreError::Protocol(
                format!("reserve_first script replied {other:?} for a plan").into(),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Allowed: the candidate it names, and only it.
    let allowed_at = replies
        .iter()
        .position(|r| matches!(r, ReserveReply::Allowed { .. }));
    if allowed_at.map_or(0, |i| i as i64 + 1) != tried
        || replies
            .iter()
            .filter(|r| matches!(r, ReserveReply::Allowed { .. }))
            .count()
            > 1
    {
        return Err(StoreError::Protocol(
            format!("reserve_first script named candidate {tried} but allowed {allowed_at:?}")
                .into(),
        ));
    }
    Ok(replies)
}

/// reserve.lua's reply as the store's answer.
fn decode_reserve(plan: &ReservePlan, reply: &[Value]) -> Result<ReserveReply, StoreError> {
    use super::spec::{
        reserve_allowed as allowed, reserve_denied as denied, reserve_replayed as replayed,
        reserve_reply as h, reserve_reply_level as l, reserve_spent as spent,
    };
    let nlev = plan.levels.len();
    let tag = int_at(reply, h::TAG)?;
    match tag {
        REPLY_KEY_CONFLICT => return Ok(ReserveReply::IdempotencyConflict),
        REPLY_KEY_SPENT => {
            return Ok(ReserveReply::IdempotencySpent {
                settled: string_at(reply, spent::RECORD_STATE)? != "R",
            });
        }
        _ => {}
    }
    let now = int_at(reply, h::NOW)? as f64;
    let granted_output = int_at(reply, h::GRANTED_OUTPUT)?.max(0) as u64;
    let states = (0..nlev)
        .map(|i| state_at(reply, h::WIDTH + i * l::WIDTH + l::STATE))
        .collect::<Result<Vec<_>, _>>()?;
    let readings = state::readings(&plan.levels, &states, &[], now);
    let reclaimed = reclaimed(plan, reply, tag)?;
    let tail = tail_at(nlev);
    Ok(match tag {
        REPLY_ALLOWED => ReserveReply::Allowed {
            readings,
            granted_output,
            reserved_output: int_at(reply, tail + allowed::RESERVED_OUTPUT)?.max(0) as u64,
            reclaimed,
        },
        REPLY_DENIED => ReserveReply::Denied {
            readings,
            denied_mask: denied_at(reply, tail + denied::CHECKS)?,
            reclaimed,
        },
        REPLY_REPLAYED => ReserveReply::Replayed {
            nonce: string_at(reply, tail + replayed::NONCE)?,
            tokens: int_at(reply, tail + replayed::TOKENS)? as u64,
            lease_expires_in_ms: int_at(reply, tail + replayed::LEASE_LEFT_MS)?.max(0) as u64,
            readings,
            reclaimed,
        },
        other => return Err(unexpected("reserve", other)),
    })
}

/// Where a reserve reply of `nlev` levels has its tag's tail: after its head
/// and each level's state.
fn tail_at(nlev: usize) -> usize {
    use super::spec::{reserve_reply as h, reserve_reply_level as l};
    h::WIDTH + nlev * l::WIDTH
}

/// The expired leases the call reclaimed: a reply may end with them, packed
/// [`RECLAIM_BITS`] bits per level (global, tenant, user, session), after the tag's
/// tail.
fn reclaimed(plan: &ReservePlan, reply: &[Value], tag: i64) -> Result<Reclaimed, StoreError> {
    use super::spec::{
        reserve_allowed as allowed, reserve_denied as denied, reserve_replayed as replayed,
    };
    let tail = match tag {
        REPLY_ALLOWED => allowed::WIDTH,
        REPLY_DENIED => denied::WIDTH,
        _ => replayed::WIDTH,
    };
    let base = tail_at(plan.levels.len()) + tail;
    let packed = match reply.len() {
        n if n == base => 0,
        n if n == base + 1 => int_at(reply, base)?.max(0) as u64,
        n => {
            return Err(StoreError::Protocol(
                format!(
                    "reserve script replied with {n} values, expected {base} or {} (is \
                     lua/reserve.lua out of step with this binary?)",
                    base + 1
                )
                .into(),
            ));
        }
    };
    let mut reclaimed = Reclaimed::default();
    for level in Level::ALL {
        let shift = RECLAIM_BITS * Reclaimed::index(level) as u32;
        reclaimed.add(level, (packed >> shift) & RECLAIM_CAP);
    }
    Ok(reclaimed)
}
