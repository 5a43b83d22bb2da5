//! The `rsv_…` ids of the leases `ctxbudget inspect` lists: the ids a gateway
//! holds and logs.
//!
//! A lease is stored under its reservation's nonce alone (`#<nonce>`), while
//! the id carries tenant, user, tier, estimator key and model group before
//! the nonce, all in one base64 string — so the nonce is no substring of the
//! id (where its characters fall depends on the lengths before it). The id is
//! rebuilt instead: the parts `inspect` can name (its `--tenant`; no user or
//! its `--user`; no session or its `--session`; every configured tier; no model group or each configured
//! one; no estimator key, or each the built-in rules, the configured groups
//! or `--model` give) are tried against the owner tag in the reservation's
//! record ([`ReservationId::owner_tag`], 64 bits); the parts that give it are
//! the reservation's, so a rebuilt id is exact, never a guess.

use crate::domain::budget::record::Record;
use crate::domain::ids::NONCE_BYTES;
use crate::domain::{Limits, ReservationId, SessionId, TenantId, UserId};
use crate::estimator::{Encoding, ModelRules};
use crate::store::keys::Keys;
use redis::AsyncCommands;
use std::collections::BTreeMap;

/// Record keys read per MGET.
const BATCH: usize = 500;

/// The parts of a reservation id `inspect` can name.
pub(super) struct Candidates {
    users: Vec<Option<UserId>>,
    sessions: Vec<Option<SessionId>>,
    tiers: Vec<String>,
    groups: Vec<String>,
    estimators: Vec<String>,
}

impl Candidates {
    /// What `limits` (the live configuration), `--user`, `--session` and
    /// `--model` name.
    pub(super) fn new(
        limits: &Limits,
        user: Option<&UserId>,
        session: Option<&SessionId>,
        model: Option<&str>,
    ) -> Self {
        let mut estimators: Vec<String> = vec![String::new()];
        let rules = ModelRules::default();
        estimators.extend(rules.keys().into_iter().map(str::to_owned));
        estimators
            .extend([Encoding::O200kBase, Encoding::Cl100kBase].map(|e| e.as_str().to_owned()));
        // Operators often name an [estimator] group after the model group.
        estimators.extend(limits.models.keys().cloned());
        estimators.extend(model.map(str::to_owned));
        estimators.sort_unstable();
        estimators.dedup();
        let mut groups = vec![String::new()];
        groups.extend(limits.models.keys().cloned());
        let mut users = vec![None];
        users.extend(user.map(|u| Some(u.clone())));
        Candidates {
            users,
            sessions: [None].into_iter().chain([session.cloned()]).collect(),
            tiers: limits.tiers.keys().cloned().collect(),
            groups,
            estimators,
        }
    }

    /// The id of `tenant`'s reservation `nonce` whose record holds `owner`,
    /// if these parts give it; `group`: the model group whose slots hold the
    /// lease, when they do.
    pub(super) fn rebuild(
        &self,
        tenant: &TenantId,
        nonce: &str,
        owner: u64,
        group: Option<&str>,
    ) -> Option<ReservationId> {
        let base = bare(tenant).with_nonce_b64(nonce)?;
        let groups: Vec<&str> = match group {
            Some(g) => vec![g],
            None => self.groups.iter().map(String::as_str).collect(),
        };
        let whos = self
            .users
            .iter()
            .flat_map(|u| self.sessions.iter().map(move |s| (u, s)));
        for (user, session) in whos {
            for tier in &self.tiers {
                for group in &groups {
                    for estimator in &self.estimators {
                        let id = ReservationId {
                            user: user.clone(),
                            session: session.clone(),
                            tier: tier.clone(),
                            estimator: estimator.clone(),
                            group: (*group).to_owned(),
                            ..base.clone()
                        };
                        if id.owner_tag() == owner {
                            return Some(id);
                        }
                    }
                }
            }
        }
        None
    }
}

/// The owner tags in the records of `tenant`'s reservations `nonces`; a nonce
/// with no record under this tenant (another tenant's lease at the global
/// level) is absent.
pub(super) async fn owners(
    conn: &mut impl AsyncCommands,
    keys: &Keys,
    tenant: &TenantId,
    nonces: &[String],
) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let template = bare(tenant);
    let valid: Vec<(&String, ReservationId)> = nonces
        .iter()
        .filter_map(|n| Some((n, template.with_nonce_b64(n)?)))
        .collect();
    for batch in valid.chunks(BATCH) {
        // One tenant's keys share a hash tag: one slot, so one MGET on a cluster too.
        let names: Vec<String> = batch.iter().map(|(_, id)| keys.record(id)).collect();
        let records: Vec<Option<Vec<u8>>> = conn.mget(&names).await?;
        for ((nonce, _), record) in batch.iter().zip(records) {
            if let Some(r) = record.and_then(|b| Record::decode(&b).ok()) {
                out.insert((*nonce).clone(), r.owner);
            }
        }
    }
    Ok(out)
}

/// An id of `tenant` with nothing else set: what names its records' keys.
fn bare(tenant: &TenantId) -> ReservationId {
    ReservationId {
        tenant: tenant.clone(),
        user: None,
        session: None,
        tier: String::new(),
        estimator: String::new(),
        group: String::new(),
        local: false,
        nonce: [0; NONCE_BYTES],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    #[test]
    fn an_id_is_rebuilt_from_its_nonce_and_owner_tag_alone() {
        let limits = FileConfig::built_in()
            .settings(crate::config::Flags::default())
            .unwrap()
            .limits;
        let tenant = TenantId::parse("acme").unwrap();
        let alice = UserId::parse("alice").unwrap();
        let ids = [
            ReservationId::generate(tenant.clone(), Some(alice.clone()), "pro".into(), "".into()),
            ReservationId::generate(tenant.clone(), None, "free".into(), "gpt-4o".into()),
        ];
        let known = Candidates::new(&limits, Some(&alice), None, None);
        for id in &ids {
            let rebuilt = known.rebuild(&tenant, &id.nonce_b64(), id.owner_tag(), None);
            assert_eq!(rebuilt.map(|r| r.to_string()), Some(id.to_string()));
        }
        // Another user's: not rebuilt, rather than guessed.
        let bob = ReservationId::generate(
            tenant.clone(),
            Some(UserId::parse("bob").unwrap()),
            "pro".into(),
            "".into(),
        );
        let rebuilt = known.rebuild(&tenant, &bob.nonce_b64(), bob.owner_tag(), None);
        assert_eq!(rebuilt, None);
        assert_eq!(known.rebuild(&tenant, "not a nonce", 1, None), None);
    }
}
