//! The charge call: KEYS and ARGV for `lua/charge.lua` from a plan, and its
//! reply as a [`ChargeReply`]. The reply's layout is the script's contract,
//! in its header.

use super::RedisStore;
use super::wire::{Args, DOUBLES, Spec, denied_at, doubles, int_at, state_at, unexpected};
use crate::domain::budget::state;
use crate::domain::budget::{ChargePlan, ChargeReply};
use crate::domain::layout::{BUCKET_WIDTH, REPLY_ALLOWED, REPLY_DENIED, STATE_HEAD};
use crate::store::{Scope, StoreError};

impl RedisStore {
    /// Takes the plan's requests or tokens at every level (or, enforced,
    /// nothing when a bucket lacks room).
    pub(super) async fn charge_call(&self, plan: &ChargePlan) -> Result<ChargeReply, StoreError> {
        let mut inv = self.charge.prepare_invoke();
        let mut args = Args::new(&mut inv);
        // KEYS: each level's hash, outermost first.
        for (i, lp) in plan.levels.iter().enumerate() {
            let scope = Scope {
                tenant: &plan.tenant,
                user: plan.user.as_ref(),
                session: plan.session.as_ref(),
            };
            args.key(i, self.keys.plan_level(lp, scope));
        }
        use super::spec::{charge as h, charge_level as l};
        let mut head = [0.0; h::WIDTH];
        head[h::LEVELS] = plan.levels.len() as f64;
        head[h::ENFORCE] = if plan.enforce { 1.0 } else { 0.0 };
        let mut spec = Spec::default();
        spec.group(&head).costs(&plan.costs().map(|_, &v| v as f64));
        for lp in &plan.levels {
            let mut level = [0.0; l::WIDTH];
            level[l::BUCKETS] = lp.buckets.len() as f64;
            level[l::MAX_LIFE_US] = lp.max_life_us();
            spec.group(&level).buckets(lp);
        }
        use super::spec::charge_argv as a;
        args.at(a::SPEC, &spec.0)
            .at(a::DOUBLES, DOUBLES)
            .at(a::SPEC_FORMAT, doubles(spec.count()).as_ref());
        // Then each level state's format.
        for (i, lp) in plan.levels.iter().enumerate() {
            let format = doubles(STATE_HEAD + BUCKET_WIDTH * lp.buckets.len());
            args.at(a::WIDTH + i, format.as_ref());
        }
        if let Some(alerts) = self.alert_args(&plan.levels) {
            let at = args.next();
            args.at(at, &alerts.0)
                .at(at + 1, self.keys.record_prefix(&plan.tenant));
        }
        let mut reply = self.run(&inv).await?;
        if self.keys.is_clustered() {
            self.index_crossing(&plan.tenant, &mut reply).await?;
        }
        use super::spec::{charge_reply as r, reserve_denied as denied, reserve_reply_level as rl};
        let nlev = plan.levels.len();
        let now = int_at(&reply, r::NOW)? as f64;
        let states = (0..nlev)
            .map(|i| state_at(&reply, r::WIDTH + i * rl::WIDTH + rl::STATE))
            .collect::<Result<Vec<_>, _>>()?;
        let readings = state::readings(&plan.levels, &states, &[], now);
        match int_at(&reply, r::TAG)? {
            REPLY_ALLOWED => Ok(ChargeReply::Charged { readings }),
            REPLY_DENIED => Ok(ChargeReply::Denied {
                readings,
                denied_mask: denied_at(&reply, r::WIDTH + nlev * rl::WIDTH + denied::CHECKS)?,
            }),
            other => Err(unexpected("charge", other)),
        }
    }
}
