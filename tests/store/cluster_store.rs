//! Behaviour only the cluster store has: reads that span every master, and
//! replicas sharing the global level's slots.

use crate::suite::{Ctx, global_level, plan, plan_of, user_level};
use ctxbudget::domain::TenantId;
use ctxbudget::store::{LedgerStore, ReserveReply, SettleReply, Settled, Settlement, Store, Usage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_of_every_tenant_is_found_on_every_master() {
    let c = Ctx::cluster().await;
    let tenants = ["acme", "beta", "gamma"];
    // Their slots (base64url tenant ids) are served by more than one master.
    let cluster = c.redis_cluster().unwrap();
    let mut masters: Vec<usize> = ["{YWNtZQ}", "{YmV0YQ}", "{Z2FtbWE}"]
        .iter()
        .map(|tag| cluster.master_of(tag))
        .collect();
    masters.dedup();
    assert!(masters.len() > 1, "the tenants share a master: {masters:?}");
    for t in tenants {
        let mut p = plan("alice", vec![user_level(10, 1000, None)], 10, 10);
        p.id.tenant = TenantId::parse(t).unwrap();
        c.reserve(&p).await;
        let s = Settlement {
            id: &p.id,
            levels: &p.levels,
        };
        c.store.commit(s, Usage::new(15, 10)).await.unwrap();
    }
    let found = c.store.tenants().ledger_keys(true).await.unwrap();
    let mut names: Vec<String> = found.iter().map(|(t, _)| t.to_string()).collect();
    names.dedup();
    assert_eq!(names, tenants, "one SCAN per master finds them all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_settled_on_another_replica_is_freed_once_by_the_one_that_leased_it() {
    let c = Ctx::cluster().await;
    let other = c.another_replica().await;
    let levels = vec![
        global_level(None, None, Some(2)),
        user_level(10, 1000, None),
    ];
    let p = |user: &str| plan_of("acme", user, levels.clone(), 10, 10);
    let allowed = |r: &ReserveReply| matches!(r, ReserveReply::Allowed { .. });
    let (a, b) = (p("a"), p("b"));
    assert!(allowed(&c.reserve(&a).await) && allowed(&c.reserve(&b).await));
    assert!(
        !allowed(&c.reserve(&p("c")).await),
        "both global slots in use"
    );
    // `a` settles on the other replica: a message to this one frees its slot.
    let s = Settlement {
        id: &a.id,
        levels: &a.levels,
    };
    let applied = other.commit(s, Usage::new(15, 10)).await.unwrap();
    assert!(
        matches!(applied, SettleReply::Applied { .. }),
        "{applied:?}"
    );
    other.sync_now().await.unwrap();
    c.store.sync_now().await.unwrap();
    assert!(allowed(&c.reserve(&p("d")).await), "the slot came back");
    // Settling it again frees nothing more.
    let again = c.store.commit(s, Usage::new(15, 10)).await.unwrap();
    assert!(matches!(
        again,
        SettleReply::AlreadySettled(Settled::Committed(_))
    ));
    c.store.sync_now().await.unwrap();
    assert!(!allowed(&c.reserve(&p("e")).await), "still two in use");
}
