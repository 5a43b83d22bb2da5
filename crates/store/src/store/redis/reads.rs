//! The read-only calls: GetStatus's levels (`lua/status.lua`) and the adaptive
//! estimator's samples (a pipeline of `LRANGE`s).

use super::RedisStore;
use super::wire::{Args, DOUBLES, Spec, int_at, state_at};
use crate::domain::budget::state;
use crate::domain::mix::EstimatorSample;
use crate::domain::{LevelPlan, Readings};
use crate::store::{Scope, StoreError};

impl RedisStore {
    /// Reads the levels of `scope`; `exact` reads small levels' leases whole.
    pub(super) async fn status_call(
        &self,
        scope: Scope<'_>,
        levels: &[LevelPlan],
        exact: bool,
    ) -> Result<Readings, StoreError> {
        let mut inv = self.status.prepare_invoke();
        let mut args = Args::new(&mut inv);
        // KEYS: each level's hash, outermost first.
        for (i, lp) in levels.iter().enumerate() {
            args.key(i, self.keys.plan_level(lp, scope));
        }
        use super::spec::status as h;
        let mut head = [0.0; h::WIDTH];
        head[h::LEVELS] = levels.len() as f64;
        let mut spec = Spec::default();
        spec.group(&head);
        // Then one concurrency limit per level (-1: none).
        for lp in levels {
            spec.push(lp.concurrency.map_or(-1.0, |c| c as f64));
        }
        use super::spec::status_argv as a;
        args.at(a::SPEC, &spec.0)
            .at(a::DOUBLES, DOUBLES)
            .at(a::EXACT, if exact { "1" } else { "0" });
        let reply = self.run(&inv).await?;
        use super::spec::{status_reply as r, status_reply_level as rl};
        let now = int_at(&reply, r::NOW)? as f64;
        let mut states = Vec::with_capacity(levels.len());
        let mut leases = Vec::with_capacity(levels.len());
        for i in 0..levels.len() {
            let at = r::WIDTH + i * rl::WIDTH;
            states.push(state_at(&reply, at + rl::STATE)?);
            let n = int_at(&reply, at + rl::LEASES)? as f64;
            let e = int_at(&reply, at + rl::EARLIEST_EXPIRY)? as f64;
            leases.push(Some((n, e)));
        }
        Ok(state::readings(levels, &states, &leases, now))
    }

    /// Each key's samples (newest first; entries of neither layout are left out).
    pub(super) async fn samples_call(
        &self,
        keys: &[String],
    ) -> Result<Vec<Vec<EstimatorSample>>, StoreError> {
        let keys: Vec<String> = keys.iter().map(|k| self.keys.estimator(k)).collect();
        self.lists(&keys, EstimatorSample::decode).await
    }

    /// Each (estimator key, tier)'s completions (newest first; entries that
    /// are no double are left out).
    pub(super) async fn outputs_call(
        &self,
        pairs: &[(String, String)],
    ) -> Result<Vec<Vec<u64>>, StoreError> {
        let keys: Vec<String> = pairs
            .iter()
            .map(|(key, tier)| self.keys.output_samples(key, tier))
            .collect();
        let completion = |b: &[u8]| Some(f64::from_le_bytes(b.try_into().ok()?) as u64);
        self.lists(&keys, completion).await
    }

    /// Each list's entries that `decode` reads (the others left out).
    async fn lists<T>(
        &self,
        keys: &[String],
        decode: impl Fn(&[u8]) -> Option<T>,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let lrange = |pipe: &mut redis::Pipeline, k: &String| {
            pipe.cmd("LRANGE").arg(k).arg(0).arg(-1);
        };
        let lists: Vec<Vec<Vec<u8>>> = match self.keys.is_clustered() {
            // Each list in its own slot: one read per list, side by side.
            true => {
                let pipes: Vec<redis::Pipeline> = keys
                    .iter()
                    .map(|k| {
                        let mut pipe = redis::pipe();
                        lrange(&mut pipe, k);
                        pipe
                    })
                    .collect();
                let reads = pipes.iter().map(|p| self.query::<(Vec<Vec<u8>>,)>(p));
                futures_util::future::try_join_all(reads)
                    .await?
                    .into_iter()
                    .map(|(l,)| l)
                    .collect()
            }
            false => {
                let mut pipe = redis::pipe();
                keys.iter().for_each(|k| lrange(&mut pipe, k));
                self.query(&pipe).await?
            }
        };
        Ok(lists
            .iter()
            .map(|list| list.iter().filter_map(|b| decode(b)).collect())
            .collect())
    }
}
