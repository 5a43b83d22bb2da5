//! The calls on an existing reservation: Commit and Refund (`lua/settle.lua`)
//! and RenewLease (`lua/renew.lua`) — their KEYS and ARGV from a settlement,
//! and their replies as [`SettleReply`] and [`RenewReply`].

use super::RedisStore;
use super::spec::settlement_keys as k;
use super::wire::{
    Args, Call, DOUBLES, Spec, declared_at, int_at, overrun, retention_us, string_at, unexpected,
};
use crate::domain::DimMap;
use crate::domain::budget::Usage;
use crate::domain::layout::{
    REPLY_APPLIED, REPLY_EXPIRED, REPLY_NOT_FOUND, REPLY_SETTLED_BEFORE, SAMPLES_TTL_MS,
};
use crate::store::keys::{TenantKeys, lease_field, ledger_fields};
use crate::store::{RenewReply, Retention, Scope, SettleReply, Settled, Settlement, StoreError};
use redis::Value;

/// How settle.lua settles: its mode argument.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum SettleMode {
    Commit,
    Refund,
}

impl SettleMode {
    fn arg(self) -> f64 {
        match self {
            SettleMode::Commit => 1.0,
            SettleMode::Refund => 2.0,
        }
    }

    /// The record state this mode leaves.
    fn state(self) -> &'static str {
        match self {
            SettleMode::Commit => "C",
            SettleMode::Refund => "F",
        }
    }
}

impl RedisStore {
    /// Commits `usage` or refunds.
    pub(super) async fn settle_call(
        &self,
        s: Settlement<'_>,
        mode: SettleMode,
        usage: Usage,
    ) -> Result<SettleReply, StoreError> {
        use super::spec::{ledger_argv as ledger, settlement_argv as a};
        let mut inv = self.settle.prepare_invoke();
        let mut args = Args::new(&mut inv);
        let tenant = self.keys.of_tenant(&s.id.tenant);
        self.settlement_keys(&tenant, &s, &mut args);
        // On a cluster the samples' key is in another slot: pushed below.
        let cluster = self.keys.is_clustered();
        // Completions kept for the tier's learned output (0: none).
        let output_kept = match usage.learn {
            true => usage.output_kept,
            false => 0,
        };
        if !cluster {
            let n = s.levels.len();
            args.key(
                n + k::ESTIMATOR_SAMPLES,
                self.keys.estimator(&s.id.estimator),
            );
            if output_kept > 0 {
                let outputs = self.keys.output_samples(&s.id.estimator, &s.id.tier);
                args.key(n + k::OUTPUT_SAMPLES, outputs);
            }
        }
        let spec = settle_spec(&s, mode, usage, output_kept, self.retention);
        args.at(a::SPEC, &spec.0)
            .at(a::LEASE, lease_field(s.id))
            .at(a::RECORD_TTL_MS, self.retention.record_ms)
            .at(a::OWNER, s.id.owner_tag().to_le_bytes().as_slice())
            .at(a::DOUBLES, DOUBLES);
        if self.retention.ledger.is_some() {
            let (hour, day) = ledger_fields(&s.id.group, s.id.user.as_ref());
            args.at(a::WIDTH + ledger::PREFIX, tenant.ledger_base())
                .at(a::WIDTH + ledger::HOUR_FIELD, hour)
                .at(a::WIDTH + ledger::DAY_FIELD, day);
        }
        if let Some(spec) = self.alert_args(s.levels) {
            let at = args.next();
            args.at(at, spec.0);
        }
        let mut reply = self.run(&inv).await?;
        if cluster {
            self.index_crossing(&s.id.tenant, &mut reply).await?;
        }
        // On a cluster the reply carries the estimator sample to push.
        if cluster
            && let Some(Value::BulkString(sample)) = reply.get(super::spec::settle_applied::SAMPLE)
        {
            let key = self.keys.estimator(&s.id.estimator);
            self.push_sample(&key, sample, self.retention.samples).await;
        }
        let settled = decode_settle(mode, &reply)?;
        if cluster && output_kept > 0 && matches!(settled, SettleReply::Applied { .. }) {
            let completion = (usage.tokens - usage.prompt) as f64;
            let outputs = self.keys.output_samples(&s.id.estimator, &s.id.tier);
            self.push_sample(&outputs, &completion.to_le_bytes(), output_kept)
                .await;
        }
        Ok(settled)
    }

    /// Adds a sample to the list `key` as settle.lua does (newest first,
    /// `kept` of them), in a call of its own (a cluster keeps the samples in
    /// another slot than the reservation). A sample that cannot be written is
    /// only logged: the commit stands.
    async fn push_sample(&self, key: &str, sample: &[u8], kept: usize) {
        let mut pipe = redis::pipe();
        pipe.cmd("LPUSH")
            .arg(key)
            .arg(sample)
            .ignore()
            .cmd("LTRIM")
            .arg(key)
            .arg(0)
            .arg(kept as i64 - 1)
            .ignore()
            .cmd("PEXPIRE")
            .arg(key)
            .arg(SAMPLES_TTL_MS)
            .ignore();
        if let Err(e) = self.query::<()>(&pipe).await {
            tracing::warn!(error = %e, "an estimator sample was not stored");
        }
    }

    /// Extends a live reservation's lease to `ttl_ms` from now.
    pub(super) async fn renew_call(
        &self,
        s: Settlement<'_>,
        ttl_ms: u64,
    ) -> Result<RenewReply, StoreError> {
        let mut inv = self.renew.prepare_invoke();
        self.settlement_keys(
            &self.keys.of_tenant(&s.id.tenant),
            &s,
            &mut Args::new(&mut inv),
        );
        use super::spec::{renew as h, settlement_argv as a};
        let mut head = [0.0; h::WIDTH];
        head[h::LEVELS] = s.levels.len() as f64;
        head[h::LEASE_TTL_US] = ttl_ms as f64 * 1000.0;
        let mut spec = Spec::default();
        spec.group(&head);
        // Then one level bit per level.
        for lp in s.levels {
            spec.push(f64::from(lp.bit()));
        }
        Args::new(&mut inv)
            .at(a::SPEC, &spec.0)
            .at(a::LEASE, lease_field(s.id))
            .at(a::RECORD_TTL_MS, self.retention.record_ms)
            .at(a::OWNER, s.id.owner_tag().to_le_bytes().as_slice())
            .at(a::DOUBLES, DOUBLES);
        let reply = self.run(&inv).await?;
        use super::spec::renew_applied as applied;
        Ok(match int_at(&reply, applied::TAG)? {
            REPLY_APPLIED => RenewReply::Renewed {
                expires_in_ms: int_at(&reply, applied::LEASE_LEFT_MS)? as u64,
            },
            REPLY_SETTLED_BEFORE => RenewReply::AlreadySettled,
            REPLY_EXPIRED => RenewReply::Expired,
            REPLY_NOT_FOUND => RenewReply::NotFound,
            other => return Err(unexpected("renew", other)),
        })
    }

    /// The levels of a settlement as KEYS, then the reservation's record.
    fn settlement_keys<C: Call>(
        &self,
        tenant: &TenantKeys<'_>,
        s: &Settlement<'_>,
        args: &mut Args<'_, C>,
    ) {
        for (i, lp) in s.levels.iter().enumerate() {
            args.key(i, tenant.plan_level(lp, Scope::of(s.id)));
        }
        args.key(s.levels.len() + k::RECORD, tenant.record(s.id));
    }
}

/// settle.lua's reply: applied now, settled before (and how), or not found.
fn decode_settle(mode: SettleMode, reply: &[Value]) -> Result<SettleReply, StoreError> {
    let settled = |state: &str, amount: i64| match state {
        "F" => Settled::Refunded(amount.max(0) as u64),
        _ => Settled::Committed(amount),
    };
    use super::spec::{settle_applied as applied, settle_before as before};
    Ok(match int_at(reply, applied::TAG)? {
        REPLY_APPLIED => SettleReply::Applied {
            settled: settled(mode.state(), int_at(reply, applied::AMOUNT)?),
            estimated_prompt_tokens: int_at(reply, applied::ESTIMATED_PROMPT_TOKENS)?.max(0) as u64,
            reserved_spend: int_at(reply, applied::RESERVED_SPEND)?.max(0) as u64,
            reserved_output: int_at(reply, applied::RESERVED_OUTPUT)?.max(0) as u64,
            reserved_declared: declared_at(reply, applied::RESERVED_DECLARED)?,
        },
        REPLY_SETTLED_BEFORE => SettleReply::AlreadySettled(settled(
            &string_at(reply, before::RECORD_STATE)?,
            int_at(reply, before::AMOUNT)?,
        )),
        REPLY_NOT_FOUND => SettleReply::NotFound,
        other => return Err(unexpected("settle", other)),
    })
}

/// settle.lua's ARGV[1]: the usage, then each level's bit, buckets and
/// overrun credit.
fn settle_spec(
    s: &Settlement<'_>,
    mode: SettleMode,
    usage: Usage,
    output_kept: usize,
    retention: Retention,
) -> Spec {
    use super::spec::{settle as h, settle_level as l};
    let mut head = [0.0; h::WIDTH];
    head[h::LEVELS] = s.levels.len() as f64;
    head[h::MODE] = mode.arg();
    head[h::PROMPT] = usage.prompt as f64;
    // No samples kept: no sample pushed (settle.lua).
    head[h::SAMPLES_KEPT] = match usage.learn {
        true => retention.samples as f64,
        false => 0.0,
    };
    head[h::CACHED] = usage.cached as f64;
    let (hourly, daily) = retention_us(retention.ledger);
    head[h::HOURLY_RETENTION_US] = hourly;
    head[h::DAILY_RETENTION_US] = daily;
    head[h::OUTPUTS_KEPT] = output_kept as f64;
    head[h::CACHE_WRITE] = usage.cache_write as f64;
    head[h::CACHE_WRITE_1H] = usage.cache_write_1h as f64;
    head[h::REASONING] = usage.reasoning as f64;
    let used = match mode {
        SettleMode::Commit => usage.used(),
        SettleMode::Refund => DimMap::default(),
    };
    let mut spec = Spec::default();
    spec.group(&head).costs(&used);
    for lp in s.levels {
        let mut level = [0.0; l::WIDTH];
        level[l::BIT] = f64::from(lp.bit());
        level[l::BUCKETS] = lp.buckets.len() as f64;
        let (capacity, refill_us) = overrun(lp);
        level[l::OVERRUN_CAPACITY] = capacity;
        level[l::OVERRUN_REFILL_US] = refill_us;
        level[l::MAX_LIFE_US] = lp.max_life_us();
        spec.group(&level).buckets(lp);
    }
    spec
}
