//! `ctxbudget models` against a real Redis and a real service: documents
//! round-trip through get/set and export/import, bad ones are refused whole
//! with the field named, a group a tier limits cannot be deleted, a change to
//! a group's limits reaches a running service, and `inspect` shows a group's
//! buckets and slots by name, against their limits.

use crate::operations::{ctl, ctl_ok, document, temp_dir};
use crate::support;

use ctxbudget::pb::{self, Dimension, Level, Reason};
use ctxbudget::store::config_repo::ConfigStore;
use ctxbudget::store::redis::Endpoint;
use redis::Commands;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::{Harness, RedisServer, reserve, settings};

type Client = pb::budget_service_client::BudgetServiceClient<tonic::transport::Channel>;

/// One tier, no model group.
const PLAIN: &str = r#"
[tiers.pro]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100000, period = "1d" }] }
user = { requests = [{ limit = 1000, period = "1d" }] }
"#;

/// A group gpt-4o that tier pro limits per tenant and user.
const GROUPED: &str = r#"
[models.gpt-4o]
match = ["gpt-4o", "gpt-4o-2024-*"]
context_window = 128000
global = { requests = [{ limit = 1000, period = "1d" }] }

[tiers.pro]
max_context_tokens = 100000
default_max_output_tokens = 10
tenant = { requests = [{ limit = 100000, period = "1d" }] }
user = { requests = [{ limit = 1000, period = "1d" }] }

[tiers.pro.models.gpt-4o]
tenant = { requests = [{ limit = 500, period = "1d" }], input_tokens = [{ limit = 100000, period = "1m" }], output_tokens = [{ limit = 20000, period = "1m" }], concurrency = 5 }
user = { requests = [{ limit = 100, period = "1d" }] }
"#;

const GPT_4O: &str = r#"match = ["gpt-4o", "gpt-4o-2024-*"]
context_window = 128000
global = { requests = [{ limit = 10000, period = "1m" }], input_tokens = [{ limit = 2000000, period = "1m" }], output_tokens = [{ limit = 400000, period = "1m" }], concurrency = 800 }
"#;

const MINI: &str = "match = [\"gpt-4o-mini*\"]\ncached_input_counts = false\n";

fn config_hash(redis: &RedisServer) -> BTreeMap<String, String> {
    redis.conn().hgetall("ctxb:cfg").unwrap()
}

fn stored(redis: &RedisServer, field: &str) -> Option<String> {
    redis.conn().hget("ctxb:cfg", field).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_set_get_list_export_import_delete_round_trip() {
    let redis = RedisServer::start();
    let _h = Harness::start_with(settings(PLAIN, Some(redis.url())), None).await;
    let dir = temp_dir("models-round-trip");
    let out = ctl_ok(
        &redis,
        &["models", "set", "gpt-4o", &document(&dir, "g.toml", GPT_4O)],
    );
    assert_eq!(
        out,
        "created model group gpt-4o (configuration version 2); every replica applies it within a second\n"
    );
    ctl_ok(
        &redis,
        &[
            "models",
            "set",
            "gpt-4o-mini",
            &document(&dir, "m.toml", MINI),
        ],
    );

    let list = ctl_ok(&redis, &["models", "list"]);
    let row = list
        .lines()
        .find(|l| l.starts_with("gpt-4o "))
        .unwrap_or_else(|| panic!("{list}"));
    for part in [
        "gpt-4o gpt-4o-2024-*",
        "128000",
        "true",
        "10000 req/1m, in 2000000/1m, out 400000/1m, 800 concurrent",
    ] {
        assert!(row.contains(part), "{part:?} missing from {row:?}");
    }
    let mini = list
        .lines()
        .find(|l| l.starts_with("gpt-4o-mini "))
        .unwrap();
    assert!(
        mini.contains("gpt-4o-mini*") && mini.contains("false"),
        "{mini}"
    );
    assert!(mini.contains("unlimited"), "{mini}");
    let json: Value = serde_json::from_str(&ctl_ok(&redis, &["models", "list", "--json"])).unwrap();
    assert_eq!(json["gpt-4o"]["context_window"], 128000, "{json}");
    assert_eq!(json["gpt-4o-mini"]["cached_input_counts"], false, "{json}");

    // `get` prints what `set` takes back unchanged, as TOML and as JSON.
    let get = ctl_ok(&redis, &["models", "get", "gpt-4o"]);
    assert!(
        get.contains("`ctxbudget models set gpt-4o FILE` takes this document back"),
        "{get}"
    );
    for json in [false, true] {
        let before = stored(&redis, "model:gpt-4o").unwrap();
        let mut get = vec!["models", "get", "gpt-4o"];
        if json {
            get.push("--json");
        }
        let file = document(&dir, "back", &ctl_ok(&redis, &get));
        let out = ctl_ok(&redis, &["models", "set", "gpt-4o", &file]);
        assert!(out.starts_with("updated model group gpt-4o"), "{out}");
        assert_eq!(
            stored(&redis, "model:gpt-4o").unwrap(),
            before,
            "json {json}"
        );
    }

    // `export` prints a file `import` takes back: delete both, import, same documents.
    let saved = [
        stored(&redis, "model:gpt-4o").unwrap(),
        stored(&redis, "model:gpt-4o-mini").unwrap(),
    ];
    let export = document(&dir, "export.toml", &ctl_ok(&redis, &["models", "export"]));
    for name in ["gpt-4o", "gpt-4o-mini"] {
        let out = ctl_ok(&redis, &["models", "delete", name]);
        assert!(
            out.starts_with(&format!("deleted model group {name} ")),
            "{out}"
        );
        assert_eq!(stored(&redis, &format!("model:{name}")), None);
    }
    assert!(ctl_ok(&redis, &["models", "list"]).contains("(none)"));
    let out = ctl_ok(&redis, &["models", "import", &export]);
    assert_eq!(out.matches("created model group").count(), 2, "{out}");
    let restored = [
        stored(&redis, "model:gpt-4o").unwrap(),
        stored(&redis, "model:gpt-4o-mini").unwrap(),
    ];
    assert_eq!(restored, saved);

    // The audit log names the group's field.
    let cfg = ConfigStore::connect(&Endpoint::Single(redis.url()), &Default::default(), "ctxb:")
        .await
        .unwrap();
    let history = cfg.history(20).await.unwrap();
    let created = history
        .iter()
        .find(|e| e.field == "model:gpt-4o" && e.old.is_empty())
        .expect("a creation of model:gpt-4o");
    assert_eq!(created.actor, "test-operator");
    assert!(created.new.contains("gpt-4o-2024-*"), "{}", created.new);
    assert!(
        history
            .iter()
            .any(|e| e.field == "model:gpt-4o" && e.new.is_empty()),
        "the deletion is recorded"
    );
    let text = ctl_ok(&redis, &["tiers", "history"]);
    assert!(text.contains("model:gpt-4o  version 2 (created)"), "{text}");
    assert!(text.contains("(deleted)"), "{text}");

    // A tier's per-group limits round-trip through `tiers get` and `tiers set`.
    let tier = "max_context_tokens = 100000\ndefault_max_output_tokens = 10\n\
         [models.gpt-4o.tenant]\nrequests = [{ limit = 50, period = \"1h\" }]\n\
         input_tokens = [{ limit = 100000, period = \"1m\" }]\n\
         [models.\"gpt-4o-mini\".user]\nconcurrency = 2\n";
    ctl_ok(
        &redis,
        &["tiers", "set", "pro", &document(&dir, "pro.toml", tier)],
    );
    let get = ctl_ok(&redis, &["tiers", "get", "pro"]);
    assert!(get.contains("[models.gpt-4o.tenant]"), "{get}");
    for json in [false, true] {
        let before = stored(&redis, "tier:pro").unwrap();
        assert!(before.contains("\"models\""), "{before}");
        let mut get = vec!["tiers", "get", "pro"];
        if json {
            get.push("--json");
        }
        let file = document(&dir, "tier-back", &ctl_ok(&redis, &get));
        ctl_ok(&redis, &["tiers", "set", "pro", &file]);
        assert_eq!(stored(&redis, "tier:pro").unwrap(), before, "json {json}");
    }
    let tiers = ctl_ok(&redis, &["tiers", "list"]);
    assert!(tiers.contains("gpt-4o, gpt-4o-mini"), "{tiers}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_model_changes_are_refused_naming_the_field_and_write_nothing() {
    let redis = RedisServer::start();
    let _h = Harness::start_with(settings(GROUPED, Some(redis.url())), None).await;
    let dir = temp_dir("models-refused");
    let before = config_hash(&redis);
    let cases: [(&str, &str, &[&str]); 6] = [
        (
            "other",
            "match = [\"gpt-*\"]\n",
            &["models.other.match", "\"gpt-*\"", "\"gpt-4o\""],
        ),
        (
            "o3",
            "match = [\"o3\"]\nburst = 3\n",
            &["models.o3.burst", "unknown field"],
        ),
        (
            "o3",
            r#"{"match": ["o3"], "global": {"requets": []}}"#,
            &["models.o3.global", "requets"],
        ),
        (
            "o3",
            "match = [\"o3\"]\nglobal = { requests = [{ limit = 5, period = \"0s\" }] }\n",
            &["models.o3.global.requests[0].period"],
        ),
        ("o3", "match = []\n", &["models.o3.match"]),
        (
            "o:3",
            "match = [\"o3\"]\n",
            &["models.o:3", "model group name"],
        ),
    ];
    for (name, text, wanted) in cases {
        let file = document(&dir, "bad.toml", text);
        let err = ctl(&redis, &["models", "set", name, &file])
            .await
            .unwrap_err();
        let message = format!("{err:#}");
        for w in wanted.iter().chain(&["nothing was written"]) {
            assert!(message.contains(w), "{text}: {w:?} missing from {message}");
        }
    }

    // A tier may only limit a group that exists.
    let tier = "max_context_tokens = 1000\ndefault_max_output_tokens = 10\n\
                [models.nope.user]\nconcurrency = 1\n";
    let err = ctl(
        &redis,
        &["tiers", "set", "pro", &document(&dir, "t.toml", tier)],
    )
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("tiers.pro.models.nope") && message.contains("nothing was written"),
        "{message}"
    );

    // A group a tier limits cannot be deleted; the message says what to do.
    let err = ctl(&redis, &["models", "delete", "gpt-4o"])
        .await
        .unwrap_err();
    let message = format!("{err:#}");
    for w in [
        "tiers.pro.models.gpt-4o",
        "ctxbudget tiers set pro",
        "nothing was written",
    ] {
        assert!(message.contains(w), "{w:?} missing from {message}");
    }
    let err = ctl(&redis, &["models", "delete", "o3"]).await.unwrap_err();
    assert!(
        format!("{err:#}").contains("the groups are: gpt-4o"),
        "{err:#}"
    );

    // An import is checked whole: one bad group, and the good one is not written either.
    let import = "[models.o3]\nmatch = [\"o3\"]\n\n[models.mini]\nmatch = [\"gpt-4o*\"]\n";
    let err = ctl(
        &redis,
        &["models", "import", &document(&dir, "i.toml", import)],
    )
    .await
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("\"gpt-4o*\"") && message.contains("nothing was written"),
        "{message}"
    );
    let err = ctl(
        &redis,
        &["models", "import", &document(&dir, "none.toml", PLAIN)],
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("no [models.*] sections"),
        "{err:#}"
    );

    assert_eq!(
        config_hash(&redis),
        before,
        "a refused change wrote something"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The global request limit of group `group` a replica reports for `model`.
async fn group_global_requests(c: &mut Client, model: &str, group: &str) -> Option<(u64, i64)> {
    let s = c
        .get_status(pb::GetStatusRequest {
            tenant_id: "acme".into(),
            tier: "pro".into(),
            model: model.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    s.limits
        .iter()
        .find(|l| {
            l.level() == Level::Global
                && l.dimension() == Dimension::Requests
                && l.model_group == group
        })
        .map(|l| (l.limit, l.remaining))
}

/// Polls the replica until `done` holds of the group's global request limit
/// (limit, remaining), or fails after a deadline.
async fn wait_for(c: &mut Client, what: &str, done: impl Fn(Option<(u64, i64)>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = group_global_requests(c, "gpt-4o", "gpt-4o").await;
        if done(seen) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: still {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A request for `model` that is served: committed (a refund would give
/// the request back to the request buckets).
async fn try_reserve(c: &mut Client, model: &str) -> pb::CheckAndReserveResponse {
    let mut request = reserve("acme", "u", "pro", 10, 10);
    request.model = model.into();
    let r = c.check_and_reserve(request).await.unwrap().into_inner();
    if r.allowed {
        let commit = pb::CommitRequest {
            reservation_id: r.reservation_id.clone(),
            prompt_tokens: 10,
            completion_tokens: 10,
            ..Default::default()
        };
        c.commit(commit).await.unwrap();
    }
    r
}

fn group_doc(limit: u64) -> String {
    format!(
        "match = [\"gpt-4o\", \"gpt-4o-2024-*\"]\n\
         global = {{ requests = [{{ limit = {limit}, period = \"1h\" }}] }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_group_change_reaches_a_running_service() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(PLAIN, Some(redis.url())), None).await;
    let dir = temp_dir("models-live");
    let c = &mut h.client;
    assert!(try_reserve(c, "gpt-4o").await.allowed);
    ctl_ok(
        &redis,
        &[
            "models",
            "set",
            "gpt-4o",
            &document(&dir, "g1.toml", &group_doc(1000)),
        ],
    );
    wait_for(c, "the group is applied", |s| {
        s.is_some_and(|(l, _)| l == 1000)
    })
    .await;
    assert!(try_reserve(c, "gpt-4o").await.allowed);

    // Lowered to 2 an hour: the one request used is kept, so one is left.
    ctl_ok(
        &redis,
        &[
            "models",
            "set",
            "gpt-4o",
            &document(&dir, "g2.toml", &group_doc(2)),
        ],
    );
    wait_for(c, "the lower limit is applied", |s| {
        s.is_some_and(|(l, _)| l == 2)
    })
    .await;
    assert!(try_reserve(c, "gpt-4o-2024-08-06").await.allowed);
    let denied = try_reserve(c, "gpt-4o").await;
    assert!(!denied.allowed, "{denied:?}");
    assert_eq!(denied.reason(), Reason::RpmExceeded);
    assert_eq!(denied.limiting_level(), Level::Global);
    assert_eq!(denied.limiting_model_group, "gpt-4o", "{denied:?}");
    let other = try_reserve(c, "o3").await;
    assert!(other.allowed, "a model of no group passes: {other:?}");
    assert!(other.limits.iter().all(|l| l.model_group.is_empty()));

    // Raised to 36000 an hour (10 a second): room again once applied.
    ctl_ok(
        &redis,
        &[
            "models",
            "set",
            "gpt-4o",
            &document(&dir, "g3.toml", &group_doc(36_000)),
        ],
    );
    wait_for(c, "the higher limit is applied and refills", |s| {
        s.is_some_and(|(l, remaining)| l == 36_000 && remaining >= 1)
    })
    .await;
    let again = try_reserve(c, "gpt-4o").await;
    assert!(again.allowed, "{again:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `inspect` as JSON.
fn inspect_json(redis: &RedisServer, extra: &[&str]) -> Value {
    let mut args = vec!["inspect", "--tenant", "acme", "--tier", "pro", "--json"];
    args.extend_from_slice(extra);
    let out = ctl_ok(redis, &args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The bucket of (level, group, dimension, period) in an inspect report.
fn bucket<'a>(report: &'a Value, level: &str, group: &str, dim: &str, period: &str) -> &'a Value {
    report["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| {
            b["level"] == level
                && b["model_group"] == group
                && b["dimension"] == dim
                && b["period"] == period
        })
        .unwrap_or_else(|| panic!("no {level} {group} {dim}/{period} bucket in {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_a_model_groups_buckets_and_slots_against_their_limits() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(GROUPED, Some(redis.url())), None).await;
    // Held, not settled: its lease stays in the group's tenant slots.
    let r = h
        .client
        .check_and_reserve(reserve("acme", "u", "pro", 100, 10))
        .await
        .unwrap()
        .into_inner();
    assert!(r.allowed, "{r:?}");

    let report = inspect_json(&redis, &["--model", "gpt-4o"]);
    assert_eq!(report["model_group"], "gpt-4o");
    let tenant = bucket(&report, "tenant", "gpt-4o", "requests", "1d");
    assert_eq!(tenant["limit"], 500, "{tenant}");
    let now = tenant["level_now"].as_f64().unwrap();
    assert!((499.0..499.5).contains(&now), "{tenant}");
    assert_eq!(
        bucket(&report, "tenant", "gpt-4o", "input_tokens", "1m")["limit"],
        100_000
    );
    assert_eq!(
        bucket(&report, "tenant", "gpt-4o", "output_tokens", "1m")["limit"],
        20_000
    );
    let global = bucket(&report, "global", "gpt-4o", "requests", "1d");
    assert_eq!(global["limit"], 1000, "{global}");
    assert!(global["level_now"].as_f64().unwrap() < 1000.0, "{global}");
    let all = report["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["level"] == "tenant" && b["model_group"].is_null())
        .expect("the all-model tenant bucket");
    assert_eq!(
        (&all["dimension"], &all["limit"]),
        (&Value::from("requests"), &Value::from(100_000))
    );
    let leases = report["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "{report:#}");
    assert_eq!(
        (&leases[0]["level"], &leases[0]["model_group"]),
        (&Value::from("tenant"), &Value::from("gpt-4o"))
    );
    assert!(leases[0]["expires_in_ms"].as_i64().unwrap() > 0);
    let limits = &report["limits"];
    assert_eq!(
        limits["models"]["gpt-4o"]["tenant"]["requests"][0]["limit"], 500,
        "{limits}"
    );
    assert_eq!(
        limits["model_group"]["global"]["requests"][0]["limit"], 1000,
        "{limits}"
    );

    // In words: the group's limits in force, its buckets and its lease by name.
    let text = ctl_ok(
        &redis,
        &[
            "inspect", "--tenant", "acme", "--user", "u", "--tier", "pro", "--model", "gpt-4o",
        ],
    );
    for line in [
        "model gpt-4o (group gpt-4o)",
        "model gpt-4o global  1000 req/1d",
        "model gpt-4o  tenant 500 req/1d, in 100000/1m, out 20000/1m, 5 concurrent; user 100 req/1d",
    ] {
        assert!(text.contains(line), "{line:?} missing from\n{text}");
    }
    let row = text
        .lines()
        .find(|l| l.starts_with("tenant") && l.contains("requests per 1d") && l.contains("gpt-4o"))
        .unwrap_or_else(|| panic!("{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[..6],
        ["tenant", "gpt-4o", "requests", "per", "1d", "500"],
        "{row}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("tenant")
            && l.contains("gpt-4o")
            && l.contains(&r.reservation_id)),
        "the lease in the group's slots, by name and reservation id:\n{text}"
    );

    // Without --model every group's buckets still know their limits.
    let report = inspect_json(&redis, &[]);
    assert_eq!(
        bucket(&report, "tenant", "gpt-4o", "requests", "1d")["limit"],
        500
    );

    // A deleted group's buckets stay, shown by tag.
    let dir = temp_dir("models-inspect");
    let o = document(
        &dir,
        "o.toml",
        "match = [\"o3\"]\nglobal = { requests = [{ limit = 50, period = \"1d\" }] }\n",
    );
    ctl_ok(&redis, &["models", "set", "o-series", &o]);
    let c = &mut h.client;
    let deadline = Instant::now() + Duration::from_secs(10);
    while group_global_requests(c, "o3", "o-series").await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the o-series group is never applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(try_reserve(c, "o3").await.allowed);
    let named = inspect_json(&redis, &[]);
    assert_eq!(
        bucket(&named, "global", "o-series", "requests", "1d")["limit"],
        50
    );
    ctl_ok(&redis, &["models", "delete", "o-series"]);
    let tag = format!("tag {}", ctxbudget::domain::model::group_tag("o-series"));
    let report = inspect_json(&redis, &[]);
    let orphan = bucket(&report, "global", &tag, "requests", "1d");
    assert!(orphan["limit"].is_null(), "{orphan}");
    let _ = std::fs::remove_dir_all(dir);
}
