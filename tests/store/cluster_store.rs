//! Behaviour only the cluster store has: reads that span every master.

use crate::suite::{Ctx, plan, user_level};
use ctxbudget::domain::TenantId;
use ctxbudget::store::{Settlement, Store, Usage};

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
