//! GetStatus and GetEstimator; the correction a decision applies, read from
//! the store before a key's first use; and the refresh that keeps each
//! replica's estimator multipliers in step with the samples in the store. Every
//! store call goes through the breaker.

use super::{Engine, EngineError};
use crate::domain::decision::{self, LimitState};
use crate::domain::plan;
use crate::domain::{Level, Reading, SessionId, TenantId, UserId};
use crate::estimator::content::ContentFit;
use crate::estimator::output::LearnedOutput;
use crate::estimator::{Correction, Corrector};
use crate::store::{Scope, Store, StoreError};

/// A GetStatus, fields validated (in `api/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusRequest {
    /// The customer.
    pub tenant: TenantId,
    /// The user, for user-level limits too.
    pub user: Option<UserId>,
    /// The session, for session-level limits too.
    pub session: Option<SessionId>,
    /// The tier name.
    pub tier: String,
    /// A model: its group's limits too.
    pub model: Option<String>,
}

/// Live leases at one level (of all models, or of one model group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LevelLeases {
    /// The level.
    pub level: Level,
    /// The model group whose slots these are; `None` for all models.
    pub model_group: Option<String>,
    /// Live leases.
    pub active: u64,
    /// The concurrency limit.
    pub limit: u64,
}

/// The answer to GetStatus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusOutcome {
    /// Every limit of the scope.
    pub limits: Vec<LimitState>,
    /// Live leases per level with a concurrency limit.
    pub leases: Vec<LevelLeases>,
    /// Read from this replica's memory while the store is unavailable.
    pub degraded: bool,
}

/// One estimator key as this replica sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct EstimatorView {
    /// The key (a model, or a group of models).
    pub key: String,
    /// The multiplier applied to new estimates.
    pub multiplier: f64,
    /// Samples in the window.
    pub samples: u64,
    /// P95 of the samples before clamping.
    pub p95_ratio: f64,
    /// Milliseconds since the last refresh from the store (`None`: not yet).
    pub refreshed_ms_ago: Option<u64>,
    /// `scalar` or `content` (`[estimator] correction`).
    pub correction: Correction,
    /// The content-aware fit, once it has enough samples.
    pub fit: Option<ContentFit>,
    /// The learned output of each tier reserving under the key, by tier.
    pub learned_outputs: Vec<(String, LearnedOutput)>,
}

impl<S: Store> Engine<S> {
    /// GetStatus: every limit of the scope; with a model, its group's too.
    pub async fn status(&self, req: &StatusRequest) -> Result<StatusOutcome, EngineError> {
        let limits = self.limits();
        let tier = self.resolve_tier(&limits, &req.tier, req.tenant.as_str())?;
        let scope = plan::Scope {
            tier: Some(&tier),
            group: req.model.as_deref().and_then(|m| limits.group_of(m)),
            has_user: req.user.is_some(),
            has_session: req.session.is_some(),
            now_us: self.store().now_us(),
        };
        let levels = plan::levels(&limits, scope, false);
        let scope = Scope {
            tenant: &req.tenant,
            user: req.user.as_ref(),
            session: req.session.as_ref(),
        };
        // Degraded: what this replica decides by.
        let (levels, readings, degraded) = self.budget.status(scope, levels, true).await?;
        let mut leases = Vec::new();
        let mut end = 0;
        for lp in &levels {
            end += lp.reading_count();
            if let Some(limit) = lp.concurrency
                && let Some(Reading::Concurrency { active, .. }) = readings.get(end - 1)
            {
                leases.push(LevelLeases {
                    level: lp.level,
                    model_group: lp.concurrency_group().map(str::to_owned),
                    active: *active,
                    limit,
                });
            }
        }
        Ok(StatusOutcome {
            limits: decision::limit_states(&levels, &readings),
            leases,
            degraded,
        })
    }

    /// GetEstimator: every key this replica knows, or only `model`'s.
    pub async fn estimators(&self, model: Option<&str>) -> Result<Vec<EstimatorView>, EngineError> {
        let wanted = model.map(|m| self.counter.rules().estimator_key(m).to_string());
        if let Some(key) = &wanted {
            // Make sure the key is known and fresh before answering.
            self.multipliers.get(key);
            self.load_estimator(key).await?;
        }
        let outputs = self.multipliers.outputs().snapshot();
        for ((key, _), _) in &outputs {
            // A key only learning outputs (caller-counted prompts) is shown too.
            self.multipliers.get(key);
        }
        let of_key = |key: &str| -> Vec<(String, LearnedOutput)> {
            outputs
                .iter()
                .filter(|((k, _), _)| k == key)
                .map(|((_, tier), l)| (tier.clone(), l.clone()))
                .collect()
        };
        Ok(self
            .multipliers
            .snapshot()
            .into_iter()
            .filter(|(k, _)| wanted.as_ref().is_none_or(|w| w == k))
            .map(|(key, s)| EstimatorView {
                learned_outputs: of_key(&key),
                key,
                multiplier: s.multiplier,
                samples: s.samples as u64,
                p95_ratio: s.p95,
                refreshed_ms_ago: s.refreshed.map(|t| t.elapsed().as_millis() as u64),
                correction: self.multipliers.settings().correction,
                fit: s.fit,
            })
            .collect())
    }

    /// The correction to apply under estimator `key`. A key this replica has
    /// never read is read from the store first, so a replica's first decision
    /// uses what every replica's Commits taught, not the initial value; when
    /// the store cannot answer (the breaker counts the call), the cached or
    /// initial value.
    pub(super) async fn corrector(&self, key: &str) -> Corrector {
        let (cached, read) = self.multipliers.lookup(key);
        if read {
            return cached;
        }
        match self.load_estimator(key).await {
            Ok(corrector) => corrector,
            Err(e) => {
                tracing::debug!(key, error = %e, "estimator samples unavailable; using the cached correction");
                cached
            }
        }
    }

    /// The learned output of (`key`, `tier`): read from the store first when
    /// this replica never has (as [`Self::corrector`] does); `None` until
    /// enough completions, or while the store cannot say.
    pub(super) async fn learned_output(&self, key: &str, tier: &str) -> Option<u64> {
        let outputs = self.multipliers.outputs();
        let (cached, read) = outputs.lookup(key, tier);
        if read {
            return cached;
        }
        let pair = [(key.to_owned(), tier.to_owned())];
        match self
            .budget
            .call("estimator", self.store().output_samples(&pair))
            .await
        {
            Ok(samples) => {
                outputs.update(key, tier, samples.first().map_or(&[][..], Vec::as_slice))
            }
            Err(e) => {
                tracing::debug!(key, tier, error = %e, "completion samples unavailable; holding the whole output");
                cached
            }
        }
    }

    /// Reads `key`'s samples from the store, through the breaker, and installs
    /// them; returns the correction.
    async fn load_estimator(&self, key: &str) -> Result<Corrector, StoreError> {
        let keys = [key.to_string()];
        let samples = self
            .budget
            .call("estimator", self.store().estimator_samples(&keys))
            .await?;
        let samples = samples.first().map_or(&[][..], Vec::as_slice);
        Ok(self.multipliers.update(key, samples))
    }

    /// Reads the samples of every key in use from the store and recomputes
    /// their multipliers. The server runs this every half second.
    pub async fn refresh_estimators(&self) -> Result<usize, StoreError> {
        let keys = self.multipliers.active_keys();
        if keys.is_empty() && self.multipliers.outputs().active_pairs().is_empty() {
            return Ok(0);
        }
        if self.breaker_state() == super::BreakerState::Open {
            return Ok(0);
        }
        let samples = self
            .budget
            .call("estimator", self.store().estimator_samples(&keys))
            .await?;
        for (key, s) in keys.iter().zip(&samples) {
            let corrector = self.multipliers.update(key, s);
            crate::telemetry::multiplier(key, corrector.multiplier);
        }
        let outputs = self.multipliers.outputs();
        let pairs = outputs.active_pairs();
        if !pairs.is_empty() {
            let samples = self
                .budget
                .call("estimator", self.store().output_samples(&pairs))
                .await?;
            for ((key, tier), s) in pairs.iter().zip(&samples) {
                outputs.update(key, tier, s);
            }
        }
        Ok(keys.len() + pairs.len())
    }
}
