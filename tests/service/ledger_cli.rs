//! `ctxbudget usage` and `ctxbudget reconcile`, the real binary, against the
//! ledger a real service wrote in a real Redis: the usage sums are exactly
//! what the Commits charged (per group, per user), and the reconciliation
//! against a provider export made from the same traffic shows no drift — and
//! flags, failing, the one row an edit changed.

use crate::operations::{ctl_binary, ctl_ok, document, temp_dir};
use crate::support;

use ctxbudget::pb;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use support::{Harness, RedisServer, reserve, settings};

const CONFIG: &str = r#"
[models.gpt-4o]
match = ["gpt-4o", "gpt-4o-2024-*"]

[models.claude]
match = ["claude-*"]

[prices.gpt-4o]
input = 2.50
cached_input = 1.25
output = 10.00

[prices.claude]
input = 3.00
output = 15.00

[tiers.t]
max_context_tokens = 200000
default_max_output_tokens = 1000
tenant = { requests = [{ limit = 1000, period = "1m" }] }
"#;

/// What the provider would bill for one model in the test's hour.
#[derive(Default, Clone, Copy)]
struct Billed {
    input: u64,
    cached: u64,
    output: u64,
    cost_micros: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn date(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .unwrap()
        .format("%Y-%m-%d")
        .to_string()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_reconcile_read_exactly_what_the_service_charged() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings(CONFIG, Some(redis.url())), None).await;
    // The traffic stays within one hour, so the provider's hourly rows are
    // the test's to write: wait out the last 30 s of an hour.
    if 3600 - now_secs() % 3600 < 30 {
        tokio::time::sleep(Duration::from_secs(3600 - now_secs() % 3600 + 1)).await;
    }
    let hour = now_secs() - now_secs() % 3600;
    let models = ["gpt-4o-2024-08-06", "claude-sonnet-4", "llama-3"];
    let mut billed: BTreeMap<&str, Billed> = BTreeMap::new();
    let (mut alice_requests, mut commits, mut cost) = (0u64, 0u64, 0u64);
    for i in 0..12u64 {
        let model = models[i as usize % 3];
        let user = if i % 2 == 0 { "alice" } else { "bob" };
        let r = h
            .client
            .check_and_reserve(pb::CheckAndReserveRequest {
                model: model.into(),
                ..reserve("acme", user, "t", 1_000 + i, 500)
            })
            .await
            .unwrap()
            .into_inner();
        let id = r.reservation_id.clone();
        let (prompt, completion, cached) = (900 + 10 * i, 100 + i, 50 * (i % 4));
        let c = h
            .client
            .commit(pb::CommitRequest {
                reservation_id: id,
                prompt_tokens: prompt,
                completion_tokens: completion,
                cached_prompt_tokens: cached,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let b = billed.entry(model).or_default();
        b.input += prompt;
        b.cached += cached;
        b.output += completion;
        b.cost_micros += c.cost_micros;
        cost += c.cost_micros;
        commits += 1;
        alice_requests += u64::from(user == "alice");
    }
    assert!(
        billed["claude-sonnet-4"].cost_micros > 0,
        "claude is priced"
    );
    // One refunded and one never settled: they count, but charge nothing.
    let refunded = h
        .client
        .check_and_reserve(reserve("acme", "alice", "t", 10, 10))
        .await
        .unwrap()
        .into_inner();
    h.client
        .refund(pb::RefundRequest {
            reservation_id: refunded.reservation_id,
        })
        .await
        .unwrap();
    h.client
        .check_and_reserve(reserve("acme", "bob", "t", 10, 10))
        .await
        .unwrap();

    let (from, to) = (date(hour - 86_400), date(hour + 2 * 86_400));
    let usage = |extra: &[&str]| {
        let mut args = vec!["usage", "--tenant", "acme", "--from", &from, "--to", &to];
        args.extend_from_slice(extra);
        json(&ctl_ok(&redis, &args))
    };
    let all = usage(&["--by", "hour", "--format", "json"]);
    let total = &all["total"];
    assert_eq!(total["requests"], commits);
    assert_eq!(total["refunds"], 1);
    assert_eq!(total["unsettled"], 1);
    assert_eq!(
        total["cost_micros"], cost,
        "exactly what the Commits charged"
    );
    let sum = |f: fn(&Billed) -> u64| billed.values().map(f).sum::<u64>();
    assert_eq!(total["prompt_tokens"], sum(|b| b.input));
    assert_eq!(total["cached_prompt_tokens"], sum(|b| b.cached));
    assert_eq!(total["completion_tokens"], sum(|b| b.output));
    let groups: Vec<&str> = all["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["model_group"].as_str().unwrap())
        .collect();
    assert_eq!(
        groups,
        ["", "claude", "gpt-4o"],
        "one line per group in the hour"
    );

    // The same by day, for one user, for one model (named by a model it matches).
    let hers = usage(&["--by", "day", "--user", "alice", "--format", "json"]);
    assert_eq!(hers["total"]["requests"], alice_requests);
    assert_eq!(hers["total"]["refunds"], 1);
    let gpt = usage(&[
        "--by",
        "month",
        "--model",
        "gpt-4o-2024-08-06",
        "--format",
        "json",
    ]);
    assert_eq!(gpt["model_group"], "gpt-4o");
    assert_eq!(
        gpt["total"]["cost_micros"],
        billed["gpt-4o-2024-08-06"].cost_micros
    );
    let csv = ctl_ok(
        &redis,
        &[
            "usage", "--tenant", "acme", "--from", &from, "--to", &to, "--format", "csv",
        ],
    );
    assert!(csv.starts_with("period,model_group,requests,"), "{csv}");
    let table = ctl_ok(
        &redis,
        &["usage", "--tenant", "acme", "--from", &from, "--to", &to],
    );
    assert!(
        table.contains("claude") && table.contains("other models"),
        "{table}"
    );
    let (ok, _, err) = ctl_binary(
        &redis,
        &[
            "usage", "--tenant", "acme", "--user", "alice", "--by", "hour", "--from", &from,
            "--to", &to,
        ],
    );
    assert!(!ok && err.contains("per day"), "{err}");
    let (ok, _, err) = ctl_binary(
        &redis,
        &[
            "usage",
            "--tenant",
            "acme",
            "--from",
            "yesterday",
            "--to",
            &to,
        ],
    );
    assert!(!ok && err.contains("RFC 3339"), "{err}");

    // The provider's export of the same hour, in its own column names.
    let dir = temp_dir("reconcile");
    let export = |edit: Option<&str>| {
        let mut text = String::from("start_time,model,n_input,n_cached,n_output,amount_usd\n");
        for (model, b) in &billed {
            let output = match edit {
                Some(m) if m == *model => b.output * 3 / 2,
                _ => b.output,
            };
            text.push_str(&format!(
                "{hour},{model},{},{},{output},{}.{:06}\n",
                b.input,
                b.cached,
                b.cost_micros / 1_000_000,
                b.cost_micros % 1_000_000
            ));
        }
        let path = dir.join(format!("export-{}.csv", edit.unwrap_or("same")));
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let columns = "hour_start=start_time,input_tokens=n_input,cached_input_tokens=n_cached,\
                   output_tokens=n_output,cost=amount_usd";
    let reconcile = |file: &str| {
        ctl_binary(
            &redis,
            &[
                "reconcile",
                "--provider-usage",
                file,
                "--from",
                &from,
                "--to",
                &to,
                "--columns",
                columns,
                "--format",
                "json",
            ],
        )
    };
    let (ok, out, err) = reconcile(&export(None));
    assert!(ok, "no drift: {out}{err}");
    let report = json(&out);
    assert_eq!(report["flagged"], 0);
    for row in report["rows"].as_array().unwrap() {
        for m in [
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
            "cost_micros",
        ] {
            assert_eq!(row[m]["drift_pct"], 0.0, "{m} of {row}");
        }
    }
    let (ok, out, err) = reconcile(&export(Some("claude-sonnet-4")));
    assert!(!ok, "a changed row fails the command: {out}");
    assert!(err.contains("1 of 3 rows drifts more than 1%"), "{err}");
    let report = json(&out);
    let flagged: Vec<&str> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["flagged"] == true)
        .map(|r| r["model_group"].as_str().unwrap())
        .collect();
    assert_eq!(flagged, ["claude"], "only the edited row: {report}");
    h.stop().await;
}

/// Usage recorded before its model group existed: `usage` shows it as `all
/// models` while no group is configured, then as `other models`; `reconcile`
/// compares the provider's rows of the new group with it — no drift, the
/// group named in the row — and counts "1 tenant".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_recorded_before_its_model_group_existed_is_no_drift() {
    let redis = RedisServer::start();
    let mut h = Harness::start_with(settings("", Some(redis.url())), None).await;
    if 3600 - now_secs() % 3600 < 30 {
        tokio::time::sleep(Duration::from_secs(3600 - now_secs() % 3600 + 1)).await;
    }
    let hour = now_secs() - now_secs() % 3600;
    let (mut input, mut output) = (0, 0);
    for i in 0..3u64 {
        let r = h
            .client
            .check_and_reserve(reserve("solo", "u", "pro", 1_000, 100))
            .await
            .unwrap()
            .into_inner();
        assert!(r.allowed, "{r:?}");
        let (prompt, completion) = (990 + i, 90 + i);
        h.client
            .commit(pb::CommitRequest {
                reservation_id: r.reservation_id,
                prompt_tokens: prompt,
                completion_tokens: completion,
                ..Default::default()
            })
            .await
            .unwrap();
        (input, output) = (input + prompt, output + completion);
    }
    let (from, to) = (date(hour - 86_400), date(hour + 2 * 86_400));
    let range = ["--from", from.as_str(), "--to", to.as_str()];
    let usage = || {
        ctl_ok(
            &redis,
            &[&["usage", "--tenant", "solo"][..], &range].concat(),
        )
    };
    let before = usage();
    assert!(
        before.contains("all models") && !before.contains("(none)"),
        "{before}"
    );

    let dir = temp_dir("reconcile-regrouped");
    let group = document(&dir, "g.toml", "match = [\"gpt-4o\"]\n");
    ctl_ok(&redis, &["models", "set", "gpt-4o", &group]);
    let after = usage();
    assert!(after.contains("other models"), "{after}");

    let export = document(
        &dir,
        "export.csv",
        &format!("hour_start,model,input_tokens,output_tokens\n{hour},gpt-4o,{input},{output}\n"),
    );
    let reconcile = |format: &str| {
        let args = [
            &["reconcile", "--provider-usage", &export, "--format", format][..],
            &range,
        ]
        .concat();
        ctl_binary(&redis, &args)
    };
    let (ok, out, err) = reconcile("json");
    assert!(ok, "no drift: {out}{err}");
    let report = json(&out);
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{report:#}");
    assert_eq!(rows[0]["model_group"], "");
    assert_eq!(rows[0]["folded_groups"], serde_json::json!(["gpt-4o"]));
    assert_eq!(rows[0]["input_tokens"]["ours"], input);
    assert_eq!(rows[0]["output_tokens"]["drift_pct"], 0.0);
    let (ok, table, err) = reconcile("table");
    assert!(ok, "{table}{err}");
    assert!(
        table.contains("other models + gpt-4o")
            && table.contains("(1 tenant in the ledger for the range)"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(dir);
    h.stop().await;
}
