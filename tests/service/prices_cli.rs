//! `ctxbudget prices` against a real Redis and a real service: prices
//! round-trip through set/get/export/import, a price for a group that does
//! not exist (or finer than a micro-dollar) is refused with nothing written,
//! and a price change reaches a running service's spend limits.

use crate::operations::{ctl, ctl_ok, document, temp_dir};
use crate::support;

use ctxbudget::pb::{self, Dimension};
use redis::Commands;
use std::time::{Duration, Instant};
use support::{Harness, RedisServer, reserve, settings};

const CONFIG: &str = r#"
[models.gpt-4o]
match = ["gpt-4o*"]

[tiers.t]
max_context_tokens = 200000
default_max_output_tokens = 100
tenant = { spend = [{ limit_usd = 10, window = "day" }] }
"#;

const PRICE: &str = "input = 2.50\ncached_input = 1.25\noutput = 10.00\n";

fn version(redis: &RedisServer) -> u64 {
    let v: Option<u64> = redis.conn().hget("ctxb:cfg", "version").unwrap();
    v.unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prices_round_trip_are_checked_and_reach_a_running_service() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(CONFIG, Some(redis.url())), None).await;
    let dir = temp_dir("prices");
    // Before any price, a request costs nothing against the spend limit.
    let ask = || pb::CheckAndReserveRequest {
        model: "gpt-4o".into(),
        ..reserve("acme", "", "t", 100_000, 10_000)
    };
    let spend = |r: &pb::CheckAndReserveResponse| {
        r.limits
            .iter()
            .find(|l| l.dimension() == Dimension::Spend)
            .map(|l| l.remaining)
            .expect("spend limit")
    };
    let r = h
        .client
        .check_and_reserve(ask())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(spend(&r), 10_000_000);

    let out = ctl_ok(
        &redis,
        &["prices", "set", "gpt-4o", &document(&dir, "p.toml", PRICE)],
    );
    assert!(
        out.starts_with("created the prices of model group gpt-4o"),
        "{out}"
    );
    let got = ctl_ok(&redis, &["prices", "get", "gpt-4o"]);
    assert!(
        got.contains("input = 2.5") && got.contains("output = 10.0"),
        "{got}"
    );
    let list = ctl_ok(&redis, &["prices", "list"]);
    assert!(list.contains("gpt-4o") && list.contains("1.25"), "{list}");
    let exported = ctl_ok(&redis, &["prices", "export"]);
    assert!(exported.contains("[prices.gpt-4o]"), "{exported}");

    // A running service charges the new price: $0.35 reserved.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = h
            .client
            .check_and_reserve(ask())
            .await
            .unwrap()
            .into_inner();
        if spend(&r) == 10_000_000 - 350_000 {
            break;
        }
        assert!(Instant::now() < deadline, "the price never applied: {r:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Refused whole, with nothing written.
    let before = version(&redis);
    let err = ctl(
        &redis,
        &["prices", "set", "o3", &document(&dir, "o.toml", PRICE)],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("no model group \"o3\""), "{err}");
    let err = ctl(
        &redis,
        &[
            "prices",
            "set",
            "gpt-4o",
            &document(&dir, "fine.toml", "input = 0.0000001\noutput = 1\n"),
        ],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("prices.gpt-4o.input"), "{err}");
    assert_eq!(version(&redis), before);

    // Export, delete, import: back as it was.
    let file = document(&dir, "all.toml", &exported);
    ctl_ok(&redis, &["prices", "delete", "gpt-4o"]);
    let gone = ctl(&redis, &["prices", "get", "gpt-4o"]).await.unwrap_err();
    assert!(gone.to_string().contains("has no price"), "{gone}");
    ctl_ok(&redis, &["prices", "import", &file]);
    let back = ctl_ok(&redis, &["prices", "get", "gpt-4o"]);
    assert!(
        back.contains("input = 2.5") && back.contains("cached_input = 1.25"),
        "{back}"
    );
    h.stop().await;
}
