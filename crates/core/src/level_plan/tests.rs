//! The levels a request passes through, planned from tiers and groups.

use super::*;
use crate::DimMap;
use crate::tier::Rate;
use crate::tier::tests_support::tier;

fn group(concurrency: Option<u64>) -> Arc<ModelGroup> {
    Arc::new(ModelGroup {
        name: "g".into(),
        patterns: vec!["g*".into()],
        context_window: None,
        cached_input_counts: true,
        global: LevelLimits {
            rates: DimMap::with([(
                Dimension::OutputTokens,
                vec![Rate {
                    limit: 100,
                    period_secs: 60,
                    window: None,
                    alert_at: Default::default(),
                }],
            )]),
            concurrency,
            ..LevelLimits::default()
        },
    })
}

#[test]
fn a_groups_rates_join_its_level_and_its_slots_follow_it() {
    let limits = Limits::default();
    let t = tier();
    let g = group(Some(3));
    let scope = Scope {
        tier: Some(&t),
        group: Some(&g),
        has_user: true,
        has_session: false,
        now_us: 0,
    };
    let plan = levels(&limits, scope, false);
    let shape: Vec<(Level, bool, usize, Option<u64>)> = plan
        .iter()
        .map(|l| (l.level, l.slots, l.buckets.len(), l.concurrency))
        .collect();
    assert_eq!(
        shape,
        vec![
            (Level::Global, false, 1, None),
            (Level::Global, true, 0, Some(3)),
            (Level::Tenant, false, 1, Some(10)),
            (Level::User, false, 2, Some(2)),
        ]
    );
    assert_eq!(plan[0].buckets[0].group, g.tag());
    assert_eq!(plan[0].group_of(&plan[0].buckets[0]), Some("g"));
    assert_eq!((plan[0].bit(), plan[1].bit()), (1, 8));
    assert_eq!(plan[1].concurrency_group(), Some("g"));
    assert_eq!(plan[2].concurrency_group(), None);
    // Settling lists the group's slots at every level, limited or not.
    let all = levels(&limits, scope, true);
    assert_eq!(all.iter().filter(|l| l.slots).count(), 3);
    // Without a group, nothing changes.
    let plain = levels(
        &limits,
        Scope {
            group: None,
            ..scope
        },
        true,
    );
    assert!(plain.iter().all(|l| !l.slots && l.group.is_none()));
    assert_eq!(plain.len(), 3);
}

#[test]
fn a_session_follows_the_user_and_its_key_lives_its_session_ttl() {
    let limits = Limits::default();
    let mut t = tier();
    t.session.concurrency = Some(2);
    t.session_ttl_secs = 600;
    let g = group(None);
    let mut m = ModelLimits::default();
    m.session.concurrency = Some(1);
    t.models.insert("g".into(), m);
    let scope = Scope {
        tier: Some(&t),
        group: Some(&g),
        has_user: false,
        has_session: true,
        now_us: 0,
    };
    let plan = levels(&limits, scope, false);
    let shape: Vec<(Level, bool, u8, Option<u64>)> = plan
        .iter()
        .map(|l| (l.level, l.slots, l.bit(), l.idle_secs))
        .collect();
    assert_eq!(
        shape,
        vec![
            (Level::Global, false, 1, None),
            (Level::Tenant, false, 2, None),
            (Level::Session, false, 64, Some(600)),
            (Level::Session, true, 128, Some(600)),
        ]
    );
    assert_eq!(plan[2].max_life_us(), 600e6);
    assert_eq!(plan[0].max_life_us(), MAX_TTL_US);
    // No session named: no session level.
    let without = levels(
        &limits,
        Scope {
            has_session: false,
            ..scope
        },
        true,
    );
    assert!(without.iter().all(|l| l.level != Level::Session));
}
